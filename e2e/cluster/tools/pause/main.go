// Command pause is the pod sandbox process of the end-to-end cluster's sandbox image: it holds the pod's
// namespaces, reaps orphaned children (it is PID 1 when the pod shares its process namespace) and exits
// on SIGINT or SIGTERM. Built here because the cluster pulls no image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
