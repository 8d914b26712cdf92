// Command cdi-validate checks CDI spec files the way containerd reads them: it loads every spec in the
// given directories with tags.cncf.io/container-device-interface (the library containerd's CRI plugin
// uses), reports each spec or directory error, and injects every device it found into an empty OCI spec.
// It prints one line per device ("vendor/class=name: N device nodes, M env") and exits 1 on any error
// or when no device was found.
package main

import (
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate SPEC_DIR...")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(os.Args[1:]...), cdi.WithAutoRefresh(false))
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
