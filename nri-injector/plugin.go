package main

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/containerd/nri/pkg/api"
)

// Injector answers the runtime's CreateContainer: the target container gets the GPU device nodes, every other
// container nothing.
type Injector struct {
	Target      Target
	DevDir      string
	ProcDevices string // the kernel's /proc/devices, read at each of the agent's containers for the driver's majors
	GivenMajors Majors // the operator's (-device-majors), allowed besides the driver's
	Log         *log.Logger
}

// CreateContainer is called by the runtime (through NRI) before each container on the node is created.
func (i *Injector) CreateContainer(
	_ context.Context, pod *api.PodSandbox, container *api.Container,
) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if !i.Target.Matches(pod, container) {
		return nil, nil, nil
	}
	majors, err := AllowedMajors(i.ProcDevices, i.GivenMajors)
	if err != nil {
		return nil, nil, fmt.Errorf("ix-nri-injector: %w", err)
	}
	devices, skipped, err := GPUDevices(i.DevDir, majors)
	if err != nil {
		// Fails the agent's container creation, so the kubelet retries it and shows why; it never runs without them.
		return nil, nil, fmt.Errorf("ix-nri-injector: %w", err)
	}
	where := fmt.Sprintf("%s/%s container %s", pod.GetNamespace(), pod.GetName(), container.GetName())
	if len(skipped) > 0 {
		i.Log.Printf("skipped %s: not a major of the Iluvatar driver (%s in %s; -device-majors adds others)",
			strings.Join(skipped, ", "), majors, i.ProcDevices)
	}
	if len(devices) == 0 {
		i.Log.Printf("no GPU device nodes (iluvatar<N>, itrctl) in %s: gave %s none", i.DevDir, where)
		return nil, nil, nil
	}
	i.Log.Printf("gave %s %s", where, Describe(devices))
	return Adjustment(devices), nil, nil
}
