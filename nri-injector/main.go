// ix-nri-injector gives the GPU agent's own container the node's Iluvatar device nodes through the runtime's NRI
// socket, so that the agent runs without privileged mode. It runs as a native sidecar in the agent's pod and acts
// on exactly one container: the agent's, in its own pod (the pod UID from the downward API).
//
//	ix-nri-injector          register with NRI and serve (flags or environment below)
//	ix-nri-injector ready    exit 0 once the injector knows whether NRI serves the node (the startupProbe: the
//	                         image has no shell)
//
// It never holds the agent back: where the node's runtime offers no NRI, it says so in one line, writes
// "unavailable: <why>" to its status file (read by the agent, which reports it on the node and falls back), marks
// itself ready and waits for its pod to stop.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"
)

const (
	defaultReadyFile  = "/run/ix-nri-injector/ready"
	defaultStatusFile = "/run/ix-nri-injector/status"
	defaultDevDir     = "/host/dev"
	// How long a missing or refusing NRI socket is retried before the node is said to have none: long enough for a
	// runtime restarting beside the pod, short enough that the agent's container is not held back for long.
	defaultWait = 15 * time.Second
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	logger := log.New(stderr, "ix-nri-injector: ", 0)
	if len(args) > 0 && args[0] == "ready" {
		return ready(args[1:], logger)
	}
	config, err := parseConfig(args, stderr)
	if err != nil {
		logger.Print(err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, config, logger); err != nil {
		logger.Print(err)
		return 1
	}
	return 0
}

// Config is what the injector acts on.
type Config struct {
	Socket      string
	DevDir      string
	ProcDevices string
	GivenMajors Majors
	ReadyFile   string
	StatusFile  string
	Wait        time.Duration
	PluginName  string
	PluginIdx   string
	Target      Target
}

func parseConfig(args []string, stderr io.Writer) (Config, error) {
	flags := flag.NewFlagSet("ix-nri-injector", flag.ContinueOnError)
	flags.SetOutput(stderr)
	var c Config
	flags.StringVar(&c.Socket, "socket", env("NRI_SOCKET", "/var/run/nri/nri.sock"), "the runtime's NRI socket")
	flags.StringVar(&c.DevDir, "dev-dir", env("HOST_DEV", defaultDevDir), "the host's /dev, mounted read-only")
	flags.StringVar(&c.ProcDevices, "proc-devices", env("PROC_DEVICES", "/proc/devices"),
		"the kernel's list of device majors: a node is given only with a major of the Iluvatar driver's there")
	majors := flags.String("device-majors", env("DEVICE_MAJORS", ""),
		"character majors allowed besides the driver's in -proc-devices, comma-separated (a driver named otherwise)")
	flags.StringVar(&c.ReadyFile, "ready-file", env("READY_FILE", defaultReadyFile),
		"written once registered, or once NRI is known to be unavailable")
	flags.StringVar(&c.StatusFile, "status-file", env("STATUS_FILE", defaultStatusFile),
		`"registered", or "unavailable: <why>" (read by the agent)`)
	flags.DurationVar(&c.Wait, "wait", defaultWait, "how long to retry a missing or refusing NRI socket")
	flags.StringVar(&c.PluginName, "plugin-name", "ix-nri-injector", "the NRI plugin name")
	flags.StringVar(&c.PluginIdx, "plugin-index", env("NRI_PLUGIN_INDEX", "50"), "the NRI plugin index (two digits)")
	flags.StringVar(&c.Target.PodUID, "pod-uid", env("POD_UID", ""), "this pod's UID (downward API metadata.uid)")
	flags.StringVar(&c.Target.Container, "container", env("AGENT_CONTAINER", ""), "the agent container's name")
	if err := flags.Parse(args); err != nil {
		return c, err
	}
	given, err := ParseGivenMajors(*majors)
	if err != nil {
		return c, err
	}
	c.GivenMajors = given
	if c.Target.PodUID == "" || c.Target.Container == "" {
		return c, errors.New("POD_UID (the downward API's metadata.uid) and AGENT_CONTAINER (the agent container's " +
			"name) must both be set: without them no container is known to be the agent's")
	}
	return c, nil
}

func env(name, fallback string) string {
	if value, ok := os.LookupEnv(name); ok && value != "" {
		return value
	}
	return fallback
}

func ready(args []string, logger *log.Logger) int {
	flags := flag.NewFlagSet("ready", flag.ContinueOnError)
	path := flags.String("ready-file", env("READY_FILE", defaultReadyFile), "the file serve writes once registered")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if _, err := os.Stat(*path); err != nil {
		logger.Printf("not decided yet whether NRI serves the node (%s absent)", *path)
		return 1
	}
	return 0
}

// noNRI is the one line for a node whose runtime offers no NRI socket.
func noNRI(socket string, err error) error {
	return fmt.Errorf("no NRI socket at %s (%v): the node's runtime has NRI off; turn it on (containerd 1.7: "+
		"[plugins.\"io.containerd.nri.v1.nri\"] disable = false; containerd 2.x: on by default; CRI-O 1.30+: "+
		"[crio.nri] enable_nri = true), or let the node fall back to the privileged DaemonSet (the chart's default; "+
		"strict=true forbids it)", socket, err)
}
