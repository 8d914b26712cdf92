package main

import (
	"bytes"
	"context"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

func contains(text, part string) bool { return strings.Contains(text, part) }

// Without NRI the injector never holds the agent back: one line naming the fix, the status the agent reads, ready
// (so the kubelet creates the agent's container), and then it waits for its pod to stop instead of exiting.
func TestWithoutAnNRISocketTheInjectorSaysSoOnceIsReadyAndWaits(t *testing.T) {
	dir := t.TempDir()
	config := Config{Socket: filepath.Join(dir, "nri.sock"), ReadyFile: filepath.Join(dir, "state", "ready"),
		StatusFile: filepath.Join(dir, "state", "status"), Wait: 300 * time.Millisecond, PluginName: "test",
		PluginIdx: "50", Target: Target{PodUID: podUID, Container: "agent"}}
	var stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- serve(ctx, config, log.New(&stderr, "", 0)) }()
	waitReady(t, config.ReadyFile, &stderr)
	if waited := time.Since(started); waited < config.Wait {
		t.Errorf("decided after %v, before retrying the socket for %v", waited, config.Wait)
	}
	status, err := os.ReadFile(config.StatusFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(status), "unavailable: no NRI socket at "+config.Socket) {
		t.Errorf("status %q", status)
	}
	select {
	case err := <-done:
		t.Fatalf("returned before its pod stopped: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stopping: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still serving 5 s after its pod stopped")
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("said %d lines, want 1: %q", len(lines), stderr.String())
	}
	for _, part := range []string{"no NRI socket at " + config.Socket, "NRI off", "disable = false", "strict=true"} {
		if !contains(lines[0], part) {
			t.Errorf("%q does not say %q", lines[0], part)
		}
	}
}

// A socket that appears while the injector retries (a runtime starting beside the pod) is registered with.
func TestASocketThatAppearsWhileRetryingIsRegisteredWith(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
	config := Config{Socket: socket, DevDir: hostDev(t), GivenMajors: testMajors, ReadyFile: filepath.Join(dir, "ready"),
		StatusFile: filepath.Join(dir, "status"), Wait: 20 * time.Second, PluginName: "test", PluginIdx: "50",
		Target: Target{PodUID: podUID, Container: "agent"}}
	var stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = serve(ctx, config, log.New(&stderr, "", 0)) }()
	time.Sleep(1500 * time.Millisecond) // at least one try has found no socket
	if _, err := os.Stat(config.ReadyFile); err == nil {
		t.Fatal("ready before the socket appeared, within its wait")
	}
	runtime := startRuntime(t, dir, socket)
	defer runtime.Stop()
	waitReady(t, config.ReadyFile, &stderr)
	if status, _ := os.ReadFile(config.StatusFile); string(status) != "registered\n" {
		t.Fatalf("status %q; log %s", status, stderr.String())
	}
}

func waitReady(t *testing.T, readyFile string, stderr *syncBuffer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for run([]string{"ready", "-ready-file", readyFile}, &bytes.Buffer{}) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not ready in 20 s: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func startRuntime(t *testing.T, dir, socket string) *adaptation.Adaptation {
	t.Helper()
	sync := func(ctx context.Context, cb adaptation.SyncCB) error { _, err := cb(ctx, nil, nil); return err }
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	runtime, err := adaptation.New("test-runtime", "v0", sync, update, adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.Start(); err != nil {
		t.Fatal(err)
	}
	return runtime
}

// The runtime's side of NRI (the same adaptation containerd builds in) on a socket of the test's own: the injector
// registers, says so in its status, marks itself ready and adjusts the agent's container as the runtime asks.
func TestThroughARealNRIRuntimeTheAgentContainerGetsTheNodes(t *testing.T) {
	dev := hostDev(t)
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
	runtime := startRuntime(t, dir, socket)
	defer runtime.Stop()

	readyFile := filepath.Join(dir, "state", "ready")
	statusFile := filepath.Join(dir, "state", "status")
	var stderr syncBuffer
	go run([]string{"-socket", socket, "-dev-dir", dev, "-proc-devices", writeProcDevices(t, procDevices),
		"-pod-uid", podUID, "-container", "agent", "-ready-file", readyFile, "-status-file", statusFile}, &stderr)
	waitReady(t, readyFile, &stderr)
	if status, _ := os.ReadFile(statusFile); string(status) != "registered\n" {
		t.Fatalf("status %q", status)
	}
	ask := func(uid, name string) *api.ContainerAdjustment {
		reply, err := runtime.CreateContainer(context.Background(), &api.CreateContainerRequest{
			Pod:       &api.PodSandbox{Id: "sandbox-" + uid, Uid: uid, Name: "p", Namespace: "n"},
			Container: &api.Container{Id: "c-" + uid + name, PodSandboxId: "sandbox-" + uid, Name: name},
		})
		if err != nil {
			t.Fatal(err)
		}
		return reply.GetAdjust()
	}
	if got := len(ask(podUID, "agent").GetLinux().GetDevices()); got != 3 {
		t.Fatalf("the agent got %d devices, want 3; log %s", got, stderr.String())
	}
	if got := len(ask("another-pod", "agent").GetLinux().GetDevices()); got != 0 {
		t.Fatalf("another pod's container got %d devices", got)
	}
}

// syncBuffer is a bytes.Buffer safe to write from the serving goroutine while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}
func (b *syncBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.buf.String() }
