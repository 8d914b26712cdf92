package main

import (
	"bytes"
	"context"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
)

const podUID = "6c1f3a52-0d1e-4a43-9d0c-3f2b1f3e9e11"

func injector(t *testing.T, out *bytes.Buffer) *Injector {
	return &Injector{
		Target:      Target{PodUID: podUID, Container: "iluvatar-device-plugin"},
		DevDir:      hostDev(t),
		ProcDevices: writeProcDevices(t, procDevices),
		Log:         log.New(out, "", 0),
	}
}

func writeProcDevices(t *testing.T, listing string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "devices")
	if err := os.WriteFile(path, []byte(listing), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestForeignMajorsAreSkippedInOneLineAndADriverLoadedLaterIsSeen(t *testing.T) {
	var out bytes.Buffer
	given := injector(t, &out)
	given.DevDir = withForeignNodes(t, given.DevDir)
	noDriver := "Character devices:\n  1 mem\n  4 tty\n"
	if err := os.WriteFile(given.ProcDevices, []byte(noDriver), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := &api.Container{Name: "iluvatar-device-plugin"}
	adjustment, _, err := given.CreateContainer(context.Background(), pod(podUID), agent)
	if err != nil || len(adjustment.GetLinux().GetDevices()) != 0 {
		t.Fatalf("without the driver: %v, %v", adjustment, err)
	}
	if !strings.Contains(out.String(), "skipped /dev/iluvatar0 (c 508:0), /dev/iluvatar12 (c 508:12), "+
		"/dev/iluvatar2 (c 1:11), /dev/iluvatar4 (c 4:1), /dev/itrctl (c 508:255): not a major of the Iluvatar "+
		"driver (none in "+given.ProcDevices) {
		t.Fatalf("log: %q", out.String())
	}
	out.Reset()
	if err := os.WriteFile(given.ProcDevices, []byte(procDevices), 0o644); err != nil { // the driver loaded
		t.Fatal(err)
	}
	adjustment, _, err = given.CreateContainer(context.Background(), pod(podUID), agent)
	if err != nil || len(adjustment.GetLinux().GetDevices()) != 3 {
		t.Fatalf("with the driver: %v, %v", adjustment, err)
	}
	if !strings.Contains(out.String(), "skipped /dev/iluvatar2 (c 1:11), /dev/iluvatar4 (c 4:1)") {
		t.Fatalf("log: %q", out.String())
	}
}

func pod(uid string) *api.PodSandbox {
	return &api.PodSandbox{Uid: uid, Name: "iluvatar-device-plugin-x7k2p", Namespace: "kube-system"}
}

func TestTheAgentContainerOfItsOwnPodGetsTheNodesAndOneLogLine(t *testing.T) {
	var out bytes.Buffer
	adjustment, updates, err := injector(t, &out).CreateContainer(
		context.Background(), pod(podUID), &api.Container{Name: "iluvatar-device-plugin"})
	if err != nil || updates != nil {
		t.Fatalf("err %v, updates %v", err, updates)
	}
	if got := len(adjustment.GetLinux().GetDevices()); got != 3 {
		t.Fatalf("%d devices, want 3", got)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "kube-system/iluvatar-device-plugin-x7k2p container "+
		"iluvatar-device-plugin /dev/iluvatar0 (c 508:0 rw), /dev/iluvatar12 (c 508:12 rw), /dev/itrctl") {
		t.Fatalf("log: %q", out.String())
	}
}

func TestNoOtherContainerGetsAnything(t *testing.T) {
	others := []struct {
		name      string
		pod       *api.PodSandbox
		container string
	}{
		{"the sidecar itself", pod(podUID), "nri-injector"},
		{"a container of another pod named as the agent", pod("0d5e8a1c-1111-4b2b-8c3c-9a9a9a9a9a9a"),
			"iluvatar-device-plugin"},
		{"a pod whose annotations claim the agent's UID", &api.PodSandbox{Uid: "other", Annotations: map[string]string{
			"io.kubernetes.pod.uid": podUID}}, "iluvatar-device-plugin"},
		{"a pod without a UID", pod(""), "iluvatar-device-plugin"},
	}
	for _, other := range others {
		t.Run(other.name, func(t *testing.T) {
			var out bytes.Buffer
			adjustment, updates, err := injector(t, &out).CreateContainer(
				context.Background(), other.pod, &api.Container{Name: other.container})
			if adjustment != nil || updates != nil || err != nil || out.Len() != 0 {
				t.Fatalf("got %v %v %v, log %q", adjustment, updates, err, out.String())
			}
		})
	}
}

func TestAnInjectorWithoutAPodUIDMatchesNoContainer(t *testing.T) {
	target := Target{Container: "iluvatar-device-plugin"}
	if target.Matches(pod(""), &api.Container{Name: "iluvatar-device-plugin"}) {
		t.Fatal("an empty UID matched a pod without one")
	}
}
