package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

const testMajor = 508 // unassigned: the nodes open nothing on the machine running the tests

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
	devices, err := GPUDevices(hostDev(t))
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
	devices, err := GPUDevices(hostDev(t))
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
	devices, err := GPUDevices(t.TempDir())
	if err != nil || len(devices) != 0 {
		t.Fatalf("got %v, %v; want nothing", devices, err)
	}
}

func TestAMissingHostDevIsAnErrorNamingIt(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "dev")
	if _, err := GPUDevices(missing); err == nil || !contains(err.Error(), missing) {
		t.Fatalf("got %v, want an error naming %s", err, missing)
	}
}
