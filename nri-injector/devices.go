package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
)

// The GPU device nodes IXML opens: one per chip, and the shared control node.
var gpuNodeName = regexp.MustCompile(`^(iluvatar[0-9]+|itrctl)$`)

// Target is the one container that gets the nodes: the agent's, in the injector's own pod.
type Target struct {
	PodUID    string
	Container string
}

// Matches is true only for the target container of the target pod; nothing read from the pod (annotations, labels)
// is trusted: the pod UID comes from the injector's own downward API.
func (t Target) Matches(pod *api.PodSandbox, container *api.Container) bool {
	return t.PodUID != "" && pod.GetUid() == t.PodUID && container.GetName() == t.Container
}

// GPUDevices lists the character devices under devDir (the host's /dev, mounted read-only) named iluvatar<N> or
// itrctl whose major is one of majors (the Iluvatar driver's), as the container sees them at /dev/<name>, with the
// numbers, mode and owner the host gives them; and, described, the nodes so named that were skipped for their major
// (a node named like a GPU but another driver's, /dev/kmsg's 1:11 or a tty's 4:1, is never given).
func GPUDevices(devDir string, majors Majors) ([]*api.LinuxDevice, []string, error) {
	entries, err := os.ReadDir(devDir)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the host's device nodes in %s: %w", devDir, err)
	}
	var devices []*api.LinuxDevice
	var skipped []string
	for _, entry := range entries {
		if !gpuNodeName.MatchString(entry.Name()) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(devDir, entry.Name()), &st); err != nil {
			continue // gone since the listing: a chip hot-unplugged
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue // not a device node (a link, a file, a block device): nothing IXML opens
		}
		if major := int64(unix.Major(st.Rdev)); !majors.Has(major) {
			skipped = append(skipped, fmt.Sprintf("/dev/%s (c %d:%d)", entry.Name(), major, unix.Minor(st.Rdev)))
			continue
		}
		devices = append(devices, &api.LinuxDevice{
			Path:     "/dev/" + entry.Name(),
			Type:     "c",
			Major:    int64(unix.Major(st.Rdev)),
			Minor:    int64(unix.Minor(st.Rdev)),
			FileMode: api.FileMode(os.FileMode(st.Mode & 0o7777)),
			Uid:      api.UInt32(st.Uid),
			Gid:      api.UInt32(st.Gid),
		})
	}
	sort.Slice(devices, func(i, j int) bool { return devices[i].Path < devices[j].Path })
	sort.Strings(skipped)
	return devices, skipped, nil
}

// Adjustment adds devices to a container. For each one the runtime writes the node into the OCI spec and a device
// cgroup rule allowing it, "c MAJOR:MINOR rw" (NRI's generate.AdjustDevices, access from LinuxDevice.AccessString):
// read and write are what IXML's open needs; mknod ("m") is not, since the node is already in the host /dev the
// container mounts, and the container has no CAP_MKNOD to use it.
func Adjustment(devices []*api.LinuxDevice) *api.ContainerAdjustment {
	adjustment := &api.ContainerAdjustment{}
	for _, device := range devices {
		adjustment.AddDevice(device)
	}
	return adjustment
}

// Describe is one device as the log line names it: /dev/iluvatar0 (c 508:0 rw).
func Describe(devices []*api.LinuxDevice) string {
	names := make([]string, 0, len(devices))
	for _, device := range devices {
		names = append(names, fmt.Sprintf("%s (%s %d:%d %s)", device.Path, device.Type, device.Major, device.Minor,
			device.AccessString()))
	}
	return strings.Join(names, ", ")
}
