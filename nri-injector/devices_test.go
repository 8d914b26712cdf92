package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

const testMajor = 508 // unassigned: the nodes open nothing on the machine running the tests

// testMajors is what the injector allows on the test host: the driver's major, as /proc/devices would name it.
var testMajors = Majors{testMajor: "iluvatar"}

// needsRoot skips where device nodes cannot be made (mknod needs CAP_MKNOD).
func needsRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making character device nodes (mknod) needs root; run go test as root (the end-to-end machine does)")
	}
}

func mknod(t *testing.T, path string, kind uint32, mode uint32, minor uint32) {
	t.Helper()
	if err := unix.Mknod(path, kind|mode, int(unix.Mkdev(testMajor, minor))); err != nil {
		t.Fatalf("mknod %s: %v", path, err)
	}
	if err := os.Chmod(path, os.FileMode(mode)); err != nil { // past the umask
		t.Fatal(err)
	}
}

// hostDev is a stand-in for the host's /dev: the GPU nodes and look-alikes that must not be given.
func hostDev(t *testing.T) string {
	t.Helper()
	needsRoot(t)
	dir := t.TempDir()
	mknod(t, filepath.Join(dir, "iluvatar0"), unix.S_IFCHR, 0o666, 0)
	mknod(t, filepath.Join(dir, "iluvatar12"), unix.S_IFCHR, 0o660, 12)
	mknod(t, filepath.Join(dir, "itrctl"), unix.S_IFCHR, 0o600, 255)
	if err := os.Chown(filepath.Join(dir, "iluvatar12"), 0, 44); err != nil {
		t.Fatal(err)
	}
	mknod(t, filepath.Join(dir, "iluvatar7"), unix.S_IFBLK, 0o666, 7) // a block device: not IXML's
	mknod(t, filepath.Join(dir, "iluvatar"), unix.S_IFCHR, 0o666, 100)
	mknod(t, filepath.Join(dir, "iluvatar3x"), unix.S_IFCHR, 0o666, 3)
	mknod(t, filepath.Join(dir, "nvidia0"), unix.S_IFCHR, 0o666, 1)
	if err := os.WriteFile(filepath.Join(dir, "iluvatar5"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("iluvatar0", filepath.Join(dir, "iluvatar9")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestOnlyTheGPUCharacterDevicesAreFoundWithTheirNumbersModeAndOwner(t *testing.T) {
	devices, _, err := GPUDevices(hostDev(t), testMajors)
	if err != nil {
		t.Fatal(err)
	}
	want := []*api.LinuxDevice{
		{Path: "/dev/iluvatar0", Type: "c", Major: testMajor, Minor: 0, FileMode: api.FileMode(os.FileMode(0o666)),
			Uid: api.UInt32(uint32(0)), Gid: api.UInt32(uint32(0))},
		{Path: "/dev/iluvatar12", Type: "c", Major: testMajor, Minor: 12, FileMode: api.FileMode(os.FileMode(0o660)),
			Uid: api.UInt32(uint32(0)), Gid: api.UInt32(uint32(44))},
		{Path: "/dev/itrctl", Type: "c", Major: testMajor, Minor: 255, FileMode: api.FileMode(os.FileMode(0o600)),
			Uid: api.UInt32(uint32(0)), Gid: api.UInt32(uint32(0))},
	}
	if len(devices) != len(want) {
		t.Fatalf("found %s, want 3 devices", Describe(devices))
	}
	for i, device := range devices {
		if !proto.Equal(device, want[i]) {
			t.Errorf("device %d: got %+v, want %+v", i, device, want[i])
		}
	}
}

func TestTheAdjustmentAddsEachNodeAndTheRuntimeAllowsItReadWrite(t *testing.T) {
	devices, _, err := GPUDevices(hostDev(t), testMajors)
	if err != nil {
		t.Fatal(err)
	}
	adjusted := Adjustment(devices).GetLinux().GetDevices()
	if len(adjusted) != 3 {
		t.Fatalf("adjustment adds %d devices, want 3", len(adjusted))
	}
	for _, device := range adjusted {
		// The rule the runtime writes for an added device: "c MAJOR:MINOR <AccessString>".
		if device.AccessString() != "rw" || device.Type != "c" {
			t.Errorf("%s: access %q type %q, want c rw", device.Path, device.AccessString(), device.Type)
		}
	}
	if got := Describe(adjusted[:1]); got != "/dev/iluvatar0 (c 508:0 rw)" {
		t.Errorf("log names the device as %q", got)
	}
}

func TestAHostDevWithoutGPUNodesGivesNothing(t *testing.T) {
	devices, _, err := GPUDevices(t.TempDir(), testMajors)
	if err != nil || len(devices) != 0 {
		t.Fatalf("got %v, %v; want nothing", devices, err)
	}
}

func TestAMissingHostDevIsAnErrorNamingIt(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "dev")
	if _, _, err := GPUDevices(missing, testMajors); err == nil || !contains(err.Error(), missing) {
		t.Fatalf("got %v, want an error naming %s", err, missing)
	}
}

// withForeignNodes adds, to a stand-in host /dev, nodes named as GPUs that are other drivers' devices: /dev/kmsg's
// 1:11 and tty1's 4:1.
func withForeignNodes(t *testing.T, dir string) string {
	t.Helper()
	for name, numbers := range map[string][2]uint32{"iluvatar2": {1, 11}, "iluvatar4": {4, 1}} {
		if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR|0o666, int(unix.Mkdev(numbers[0], numbers[1]))); err != nil {
			t.Fatalf("mknod %s: %v", name, err)
		}
	}
	return dir
}

func TestANodeNamedAsAGPUWithAnotherDriversMajorIsSkippedAndNamed(t *testing.T) {
	devices, skipped, err := GPUDevices(withForeignNodes(t, hostDev(t)), testMajors)
	if err != nil {
		t.Fatal(err)
	}
	if got := Describe(devices); got != "/dev/iluvatar0 (c 508:0 rw), /dev/iluvatar12 (c 508:12 rw), /dev/itrctl (c 508:255 rw)" {
		t.Fatalf("gave %s", got)
	}
	if strings.Join(skipped, ", ") != "/dev/iluvatar2 (c 1:11), /dev/iluvatar4 (c 4:1)" {
		t.Fatalf("skipped %q", skipped)
	}
}

func TestWithoutTheDriversMajorNothingIsGiven(t *testing.T) {
	devices, skipped, err := GPUDevices(hostDev(t), Majors{}) // no Iluvatar driver loaded
	if err != nil || len(devices) != 0 || len(skipped) != 3 {
		t.Fatalf("gave %s, skipped %v, err %v", Describe(devices), skipped, err)
	}
}

const procDevices = `Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  5 /dev/tty
 10 misc
508 iluvatar
509 itr_ctl
510 nvidia-frontend

Block devices:
  7 loop
511 iluvatar_blk
`

func TestTheDriversMajorsAreReadFromProcDevicesCharacterSectionOnly(t *testing.T) {
	majors, err := DriverMajors(strings.NewReader(procDevices))
	if err != nil {
		t.Fatal(err)
	}
	if got := majors.String(); got != "508 (iluvatar), 509 (itr_ctl)" {
		t.Fatalf("majors %s", got)
	}
}

func TestAllowedMajorsAreReadAgainAtEachUseAndAddTheGivenOnes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devices")
	given, err := ParseGivenMajors("600, 601")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("Character devices:\n  1 mem\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := AllowedMajors(path, given)
	if err != nil || before.String() != "600 (given), 601 (given)" {
		t.Fatalf("before the driver: %s, %v", before, err)
	}
	if err := os.WriteFile(path, []byte(procDevices), 0o644); err != nil { // the driver loaded since
		t.Fatal(err)
	}
	after, err := AllowedMajors(path, given)
	if err != nil || after.String() != "508 (iluvatar), 509 (itr_ctl), 600 (given), 601 (given)" {
		t.Fatalf("after: %s, %v", after, err)
	}
}

func TestAnUnreadableProcDevicesIsAnErrorNamingItUnlessMajorsAreGiven(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "devices")
	if _, err := AllowedMajors(missing, Majors{}); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("got %v, want an error naming %s", err, missing)
	}
	if majors, err := AllowedMajors(missing, Majors{508: "given"}); err != nil || !majors.Has(508) {
		t.Fatalf("got %s, %v", majors, err)
	}
}

func TestGivenMajorsAreNumbersOfACharacterMajor(t *testing.T) {
	for _, bad := range []string{"x", "-1", "5000", "508;509"} {
		if _, err := ParseGivenMajors(bad); err == nil || !strings.Contains(err.Error(), "-device-majors") {
			t.Errorf("%q: got %v, want an error naming -device-majors", bad, err)
		}
	}
	if majors, err := ParseGivenMajors(""); err != nil || len(majors) != 0 {
		t.Errorf("empty: got %s, %v", majors, err)
	}
}
