// Command cdi-validate checks CDI spec files the way containerd reads them: it loads every spec in the
// given directories with tags.cncf.io/container-device-interface (the library containerd's CRI plugin
// uses), reports each spec or directory error, and injects every device it found into an empty OCI spec.
// It prints one line per device ("vendor/class=name: N device nodes, M env") and exits 1 on any error
// or when no device was found.
//
// With --inject NAME[,NAME...] it injects those devices, in that order, into one empty OCI spec, as a
// runtime does for a container given them, and prints what the container gets as JSON:
// {"env": [...], "devices": [paths]}.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	args := os.Args[1:]
	var inject []string
	if len(args) > 1 && args[0] == "--inject" {
		inject, args = strings.Split(args[1], ","), args[2:]
	}
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate [--inject NAME[,NAME...]] SPEC_DIR...")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(args...), cdi.WithAutoRefresh(false))
	failed := false
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		failed = true
	}
	for dir, dirErr := range cache.GetSpecDirErrors() {
		fmt.Fprintf(os.Stderr, "error: %s: %v\n", dir, dirErr)
		failed = true
	}
	for path, specErrs := range cache.GetErrors() {
		for _, specErr := range specErrs {
			fmt.Fprintf(os.Stderr, "error: %s: %v\n", path, specErr)
			failed = true
		}
	}
	if inject != nil {
		if failed {
			os.Exit(1)
		}
		os.Exit(injectInOrder(cache, inject))
	}
	devices := cache.ListDevices()
	sort.Strings(devices)
	for _, name := range devices {
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if _, injectErr := cache.InjectDevices(spec, name); injectErr != nil {
			fmt.Fprintf(os.Stderr, "error: %s: %v\n", name, injectErr)
			failed = true
			continue
		}
		fmt.Printf("%s: %d device nodes, %d env\n", name, len(spec.Linux.Devices), len(spec.Process.Env))
	}
	if len(devices) == 0 {
		fmt.Fprintln(os.Stderr, "error: no CDI device found")
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}

// injectInOrder injects devices, in order, into one empty OCI spec and prints the container's env and
// device paths as JSON; the exit status.
func injectInOrder(cache *cdi.Cache, devices []string) int {
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, devices...); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return 1
	}
	paths := []string{}
	for _, device := range spec.Linux.Devices {
		paths = append(paths, device.Path)
	}
	env := spec.Process.Env
	if env == nil {
		env = []string{}
	}
	out, _ := json.Marshal(map[string][]string{"env": env, "devices": paths})
	fmt.Println(string(out))
	return 0
}
