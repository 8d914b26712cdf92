package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/nri/pkg/stub"
)

// serve registers with the runtime's NRI socket, marks itself ready and answers until the connection goes (a
// runtime restart): then it returns an error, so that the kubelet restarts the sidecar and it registers again.
func serve(ctx context.Context, config Config, logger *log.Logger) error {
	_ = os.Remove(config.ReadyFile) // a file left by an earlier run of this sidecar says nothing of this one
	if info, err := os.Stat(config.Socket); err != nil {
		return noNRI(config.Socket, err)
	} else if info.Mode()&os.ModeSocket == 0 {
		return noNRI(config.Socket, errors.New("not a socket"))
	}
	closed := make(chan struct{})
	injector := &Injector{Target: config.Target, DevDir: config.DevDir, Log: logger}
	plugin, err := stub.New(injector,
		stub.WithPluginName(config.PluginName),
		stub.WithPluginIdx(config.PluginIdx),
		stub.WithSocketPath(config.Socket),
		stub.WithOnClose(func() { close(closed) }),
	)
	if err != nil {
		return fmt.Errorf("setting up the NRI plugin: %w", err)
	}
	if err := plugin.Start(ctx); err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return noNRI(config.Socket, err)
		}
		return fmt.Errorf("registering with NRI at %s: %w", config.Socket, err)
	}
	if err := markReady(config.ReadyFile); err != nil {
		plugin.Stop()
		return err
	}
	logger.Printf("registered with NRI at %s: the GPU device nodes in %s go to container %q of pod %s only",
		config.Socket, config.DevDir, config.Target.Container, config.Target.PodUID)
	<-closed
	_ = os.Remove(config.ReadyFile)
	return errors.New("the NRI connection closed (the runtime restarted?): exiting to register again")
}

func markReady(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("marking ready: %w", err)
	}
	if err := os.WriteFile(path, []byte("registered\n"), 0o644); err != nil {
		return fmt.Errorf("marking ready: %w", err)
	}
	return nil
}
