package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/stub"
)

// The first word of the status file: what the agent reads to tell how its devices reach it.
const (
	statusRegistered  = "registered"
	statusUnavailable = "unavailable"
)

// retryEvery is the pause between two tries of a socket that is missing or refuses.
const retryEvery = time.Second

// serve registers with the runtime's NRI socket, says so in the status file, marks itself ready and answers until the
// connection goes (a runtime restart): then it returns an error, so that the kubelet restarts the sidecar and it
// registers again. Where the node offers no NRI (no socket, or one that refuses, for config.Wait), it writes
// "unavailable: <why>", marks itself ready all the same so that the agent's container is created and reports it, and
// waits for ctx (its pod's stop): exiting would only have the kubelet start it again.
func serve(ctx context.Context, config Config, logger *log.Logger) error {
	// Files left by an earlier run of this sidecar say nothing of this one.
	_ = os.Remove(config.ReadyFile)
	_ = os.Remove(config.StatusFile)
	plugin, closed, err := register(ctx, config, logger)
	if err != nil {
		var absent *unavailableError
		if !errors.As(err, &absent) {
			return err
		}
		logger.Print(absent.Error())
		if err := decided(config, statusUnavailable+": "+absent.Error()); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
	if err := decided(config, statusRegistered); err != nil {
		plugin.Stop()
		return err
	}
	logger.Printf("registered with NRI at %s: the GPU device nodes in %s go to container %q of pod %s only",
		config.Socket, config.DevDir, config.Target.Container, config.Target.PodUID)
	select {
	case <-closed:
	case <-ctx.Done():
		plugin.Stop()
		return nil
	}
	_ = os.Remove(config.ReadyFile)
	return errors.New("the NRI connection closed (the runtime restarted?): exiting to register again")
}

// unavailableError says the node's runtime offers no NRI: the one line the injector logs and the agent reports.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return e.err.Error() }

// register connects to the NRI socket, retrying a missing or refusing one until config.Wait has passed; an
// *unavailableError when it never answered.
func register(ctx context.Context, config Config, logger *log.Logger) (stub.Stub, chan struct{}, error) {
	deadline := time.Now().Add(config.Wait)
	for {
		plugin, closed, err := registerOnce(ctx, config, logger)
		var absent *unavailableError
		if err == nil || !errors.As(err, &absent) || !time.Now().Before(deadline) {
			return plugin, closed, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-time.After(retryEvery):
		}
	}
}

func registerOnce(ctx context.Context, config Config, logger *log.Logger) (stub.Stub, chan struct{}, error) {
	if info, err := os.Stat(config.Socket); err != nil {
		return nil, nil, &unavailableError{noNRI(config.Socket, err)}
	} else if info.Mode()&os.ModeSocket == 0 {
		return nil, nil, &unavailableError{noNRI(config.Socket, errors.New("not a socket"))}
	}
	closed := make(chan struct{})
	injector := &Injector{
		Target: config.Target, DevDir: config.DevDir, ProcDevices: config.ProcDevices, GivenMajors: config.GivenMajors,
		Log: logger,
	}
	plugin, err := stub.New(injector,
		stub.WithPluginName(config.PluginName),
		stub.WithPluginIdx(config.PluginIdx),
		stub.WithSocketPath(config.Socket),
		stub.WithOnClose(func() { close(closed) }),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("setting up the NRI plugin: %w", err)
	}
	if err := plugin.Start(ctx); err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, nil, &unavailableError{noNRI(config.Socket, err)}
		}
		return nil, nil, fmt.Errorf("registering with NRI at %s: %w", config.Socket, err)
	}
	return plugin, closed, nil
}

// decided writes the status file, then the ready file the startupProbe waits for: the agent's container is created
// only once the status says what this node offers.
func decided(config Config, status string) error {
	if err := writeFile(config.StatusFile, status+"\n"); err != nil {
		return fmt.Errorf("writing the status: %w", err)
	}
	if err := markReady(config.ReadyFile); err != nil {
		return err
	}
	return nil
}

func markReady(path string) error {
	if err := writeFile(path, "decided\n"); err != nil {
		return fmt.Errorf("marking ready: %w", err)
	}
	return nil
}

// writeFile replaces path whole (a reader never sees half a status).
func writeFile(path, text string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	partial := path + ".partial"
	if err := os.WriteFile(partial, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(partial, path)
}
