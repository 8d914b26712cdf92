package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

func contains(text, part string) bool { return strings.Contains(text, part) }

func TestWithoutAnNRISocketTheInjectorExitsWithOneLineNamingTheFix(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	var stderr bytes.Buffer
	code := run([]string{"-socket", socket, "-pod-uid", podUID, "-container", "agent",
		"-ready-file", filepath.Join(t.TempDir(), "ready")}, &stderr)
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if code == 0 || len(lines) != 1 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	for _, part := range []string{"no NRI socket at " + socket, "NRI off", "deviceInjection=privileged"} {
		if !contains(lines[0], part) {
			t.Errorf("%q does not say %q", lines[0], part)
		}
	}
}

func TestWithoutItsPodUIDTheInjectorRefusesToStart(t *testing.T) {
	t.Setenv("POD_UID", "")
	var stderr bytes.Buffer
	if code := run([]string{"-container", "agent"}, &stderr); code == 0 || !contains(stderr.String(), "POD_UID") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestReadyFailsUntilTheFileIsWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ready")
	var stderr bytes.Buffer
	if run([]string{"ready", "-ready-file", path}, &stderr) == 0 {
		t.Fatal("ready before the file exists")
	}
	if err := markReady(path); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"ready", "-ready-file", path}, &stderr); code != 0 {
		t.Fatalf("ready exit %d after the file was written: %s", code, stderr.String())
	}
}

// The runtime's side of NRI (the same adaptation containerd builds in) on a socket of the test's own: the injector
// registers, marks itself ready and adjusts the agent's container as the runtime asks.
func TestThroughARealNRIRuntimeTheAgentContainerGetsTheNodes(t *testing.T) {
	dev := hostDev(t)
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
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
	defer runtime.Stop()

	readyFile := filepath.Join(dir, "state", "ready")
	var stderr syncBuffer
	go run([]string{"-socket", socket, "-dev-dir", dev, "-pod-uid", podUID, "-container", "agent",
		"-ready-file", readyFile}, &stderr)
	deadline := time.Now().Add(20 * time.Second)
	for run([]string{"ready", "-ready-file", readyFile}, &bytes.Buffer{}) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not ready in 20 s: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
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
