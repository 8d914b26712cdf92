// volcano-charge runs Volcano's scheduler (its scheduler cache, session and capacity plugin, at the version go.mod
// pins) over pods and ResourceClaims read as JSON, and prints what its queue charges for them.
//
//	volcano-charge [-consumable-capacity=false] < cases.json
//	volcano-charge --version
//
// Input: {"cases": [{"name": "...", "capability": {"deviceclass/gpu.iluvatar.com": "2"},
// "claims": [ResourceClaim...], "pods": [Pod...]}]}. Each case is one scheduling session over one node with room
// for everything, one queue with the case's capability, and one PodGroup per pod (pending, one member, its
// minResources the pod's requests). The session runs the actions enqueue, allocate and backfill, as Volcano's DRA
// quota guide configures them, with the capacity plugin alone and its DRA quota on. A pod names its claims as in
// the API: spec.resourceClaims, and for a template the claim the controller made in status.resourceClaimStatuses.
// Output: per case, the pods the session allocated and the queue's status.allocated after the session, the keys
// as Volcano writes them.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	kubefeatures "k8s.io/kubernetes/pkg/features"
	batchv1alpha1 "volcano.sh/apis/pkg/apis/batch/v1alpha1"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"volcano.sh/volcano/pkg/scheduler/actions/allocate"
	"volcano.sh/volcano/pkg/scheduler/actions/backfill"
	"volcano.sh/volcano/pkg/scheduler/actions/enqueue"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
	"volcano.sh/volcano/pkg/scheduler/plugins/capacity"
	"volcano.sh/volcano/pkg/scheduler/uthelper"
	"volcano.sh/volcano/pkg/scheduler/util"
)

const (
	volcanoModule = "volcano.sh/volcano"
	queueName     = "quota"
	taskName      = "worker"
)

type input struct {
	Cases []caseInput `json:"cases"`
}

type caseInput struct {
	Name       string                     `json:"name"`
	Capability corev1.ResourceList        `json:"capability"`
	Claims     []resourcev1.ResourceClaim `json:"claims"`
	Pods       []corev1.Pod               `json:"pods"`
}

type caseResult struct {
	Name           string            `json:"name"`
	Allocated      []string          `json:"allocated"`
	QueueAllocated map[string]string `json:"queueAllocated"`
}

type output struct {
	Volcano            string       `json:"volcano"`
	ConsumableCapacity bool         `json:"consumableCapacity"`
	Cases              []caseResult `json:"cases"`
}

func main() {
	version := flag.Bool("version", false, "print the Volcano module version this is built with")
	consumable := flag.Bool("consumable-capacity", true,
		"the DRAConsumableCapacity feature gate and the capacity plugin's capacity.DRAConsumableCapacityEnable")
	verbosity := flag.String("v", "", "Volcano's log verbosity (its log goes to stderr); none by default")
	flag.Parse()
	setLogging(*verbosity)
	if *version {
		fmt.Println(volcanoModule, volcanoVersion())
		return
	}
	var in input
	decoder := json.NewDecoder(os.Stdin)
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&in); err != nil {
		fail("reading the cases from stdin: %v", err)
	}
	setGates(*consumable)
	out := output{Volcano: volcanoVersion(), ConsumableCapacity: *consumable}
	for _, c := range in.Cases {
		out.Cases = append(out.Cases, runCase(c, *consumable))
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", "  ")
	if err := encoder.Encode(out); err != nil {
		fail("writing the results: %v", err)
	}
}

func setLogging(verbosity string) {
	if verbosity == "" {
		klog.SetOutput(io.Discard)
		klog.LogToStderr(false)
		return
	}
	flags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(flags)
	if err := flags.Set("v", verbosity); err != nil {
		fail("-v %s: %v", verbosity, err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "volcano-charge: "+format+"\n", args...)
	os.Exit(1)
}

func volcanoVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == volcanoModule {
			return dep.Version
		}
	}
	return "unknown"
}

// setGates sets the scheduler's feature gates as vc-scheduler's --feature-gates would: the cache reads
// DRAConsumableCapacity itself when it sums a claim's capacity requests (pkg/scheduler/cache/cache.go).
func setGates(consumable bool) {
	gates := map[string]bool{
		string(kubefeatures.DynamicResourceAllocation): true,
		string(kubefeatures.DRAConsumableCapacity):     consumable,
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(gates); err != nil {
		fail("setting the feature gates: %v", err)
	}
}

func runCase(c caseInput, consumable bool) caseResult {
	test := uthelper.TestCommonStruct{
		Name:    c.Name,
		Plugins: map[string]framework.PluginBuilder{capacity.PluginName: capacity.New},
		Nodes:   []*corev1.Node{roomyNode(c.Pods)},
		Queues:  []*schedulingv1beta1.Queue{quotaQueue(c.Capability)},
	}
	for i := range c.Claims {
		test.ResourceClaims = append(test.ResourceClaims, &c.Claims[i])
	}
	for i := range c.Pods {
		pod, group := schedulable(c.Pods[i])
		test.Pods = append(test.Pods, pod)
		test.PodGroups = append(test.PodGroups, group)
	}
	session := test.RegisterSession(tiers(consumable), nil)
	test.Run([]framework.Action{enqueue.New(), allocate.New(), backfill.New()})
	result := caseResult{Name: c.Name, Allocated: allocatedPods(session), QueueAllocated: map[string]string{}}
	test.Close() // closing the session writes the queue's status.allocated
	if queue := session.Queues[api.QueueID(queueName)]; queue != nil {
		for name, quantity := range queue.Queue.Status.Allocated {
			if !quantity.IsZero() {
				result.QueueAllocated[string(name)] = quantity.String()
			}
		}
	}
	return result
}

// tiers enables the capacity plugin alone, as its DRA user guide configures it.
func tiers(consumable bool) []conf.Tier {
	enabled := true
	return []conf.Tier{{Plugins: []conf.PluginOption{{
		Name:               capacity.PluginName,
		EnabledAllocatable: &enabled,
		EnabledJobEnqueued: &enabled,
		Arguments: framework.Arguments{
			capacity.DynamicResourceAllocationEnable: true,
			capacity.DRAConsumableCapacityEnable:     consumable,
		},
	}}}}
}

func quotaQueue(capability corev1.ResourceList) *schedulingv1beta1.Queue {
	queue := util.BuildQueueWithResourcesQuantity(queueName, nil, nil)
	queue.Spec.Capability = capability
	return queue
}

// roomyNode has room for every pod's requests, so that only the queue decides.
func roomyNode(pods []corev1.Pod) *corev1.Node {
	allocatable := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("1000"),
		corev1.ResourceMemory: resource.MustParse("1000Gi"),
		corev1.ResourcePods:   resource.MustParse("1000"),
	}
	for _, pod := range pods {
		for _, container := range pod.Spec.Containers {
			for name := range container.Resources.Requests {
				if _, ok := allocatable[name]; !ok {
					allocatable[name] = resource.MustParse("1000")
				}
			}
		}
	}
	return util.BuildNode("node", allocatable, nil)
}

// schedulable is the pod as Volcano's scheduler would find it, pending in a PodGroup of its own in the queue,
// the PodGroup as vc-controller's podgroup controller makes one for a pod (pkg/controllers/podgroup,
// buildPodGroupFromPod): one member, minResources the pod's requests.
func schedulable(pod corev1.Pod) (*corev1.Pod, *schedulingv1beta1.PodGroup) {
	group := pod.Name + "-group"
	pod.UID = types.UID(pod.Namespace + "-" + pod.Name)
	pod.Spec.SchedulerName = "utmock-scheduler"
	pod.Status.Phase = corev1.PodPending
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[schedulingv1beta1.KubeGroupNameAnnotationKey] = group
	pod.Annotations[batchv1alpha1.TaskSpecKey] = taskName
	podGroup := util.BuildPodGroup(group, pod.Namespace, queueName, 1, map[string]int32{taskName: 1},
		schedulingv1beta1.PodGroupPending)
	minResources := corev1.ResourceList{}
	for _, container := range pod.Spec.Containers {
		for name, quantity := range container.Resources.Requests {
			sum := minResources[name]
			sum.Add(quantity)
			minResources[name] = sum
		}
	}
	podGroup.Spec.MinResources = &minResources
	return &pod, podGroup
}

func allocatedPods(session *framework.Session) []string {
	names := []string{}
	for _, job := range session.Jobs {
		for status, tasks := range job.TaskStatusIndex {
			if !api.AllocatedStatus(status) {
				continue
			}
			for _, task := range tasks {
				names = append(names, task.Name)
			}
		}
	}
	sort.Strings(names)
	return names
}
