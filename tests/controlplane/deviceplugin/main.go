// Command deviceplugin stands in, on the tests' real node, for AWS's Neuron device
// plugin and the EFA device plugin, which cannot run without the hardware. It serves
// the kubelet's device-plugin API (v1beta1) for three extended resources of the
// simulated instance type:
//
//	aws.amazon.com/neuron      ids: device indices  -> AWS_NEURON_VISIBLE_DEVICES,
//	                                                   NEURON_RT_VISIBLE_CORES (their cores),
//	                                                   /dev/neuron<N>
//	aws.amazon.com/neuroncore  ids: core indices    -> NEURON_RT_VISIBLE_CORES,
//	                                                   /dev/neuron<N> of their devices
//	vpc.amazonaws.com/efa      ids: device names    -> /dev/infiniband/uverbs<K>
//
// The hardware comes from `neuron-monitor-sim hardware` (the same table the simulated
// reports come from), as the JSON file given with --hardware. No Neuron or EFA device
// node exists here: each device node the container sees is --device-node (/dev/null).
//
// On a GPU node it stands in for NVIDIA's device plugin instead (--gpus, the JSON of
// `nvidia-ml-fake-gpus`: the fake NVML library's GPUs, so the ids are the ones the
// agent's NVML sees):
//
//	nvidia.com/gpu         ids: GPU UUIDs (NVIDIA's default `uuid` strategy)
//	                            -> NVIDIA_VISIBLE_DEVICES, /dev/nvidia<minor>, /dev/nvidiactl
//	nvidia.com/gpu.shared  with --gpu-shared-replicas N: the last GPU alone, time-sliced,
//	                       as <uuid>::<replica> (NVIDIA's renamed shared resource)
//
// With --devices N it advertises only the first N Neuron devices (and their cores): on a
// mixed node the test DRA driver publishes the others (`dradriver --first-device N`), as
// during a migration from the device plugin to DRA.
//
// The plugin runs until SIGTERM; it registers each resource with the kubelet once.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// hardware is what `neuron-monitor-sim hardware` prints.
type hardware struct {
	InstanceType   string   `json:"instance_type"`
	Devices        int      `json:"devices"`
	CoresPerDevice int      `json:"cores_per_device"`
	EfaDevices     []string `json:"efa_devices"`
}

// gpus is what `nvidia-ml-fake-gpus` prints.
type gpus struct {
	GPUs []struct {
		Index int    `json:"index"`
		UUID  string `json:"uuid"`
		Minor int    `json:"minor"`
	} `json:"gpus"`
}

// resource is one extended resource: its ids and what a container holding some gets.
type resource struct {
	api.UnimplementedDevicePluginServer
	name     string
	socket   string
	ids      []string
	allocate func(ids []string) *api.ContainerAllocateResponse
	// The ids are indices the kubelet should allocate in contiguous runs.
	contiguous bool
}

func main() {
	hardwareFile := flag.String("hardware", "", "JSON of `neuron-monitor-sim hardware` (this or --gpus)")
	gpuFile := flag.String("gpus", "", "JSON of `nvidia-ml-fake-gpus` (this or --hardware)")
	replicas := flag.Int("gpu-shared-replicas", 0, "with --gpus: the last GPU as nvidia.com/gpu.shared with this many replicas")
	dir := flag.String("socket-dir", api.DevicePluginPath, "the kubelet's device-plugin directory")
	deviceNode := flag.String("device-node", "/dev/null", "host device node behind every simulated device node")
	only := flag.Int("devices", 0, "with --hardware: advertise only the first N Neuron devices (0: all)")
	flag.Parse()
	var all []*resource
	switch {
	case *gpuFile != "" && *hardwareFile == "":
		g, err := readGPUs(*gpuFile)
		if err != nil {
			log.Fatalf("deviceplugin: %v", err)
		}
		if *replicas < 0 || *replicas > 16 {
			log.Fatalf("deviceplugin: --gpu-shared-replicas %d: 0 to 16", *replicas)
		}
		all = gpuResources(g, *replicas, *deviceNode)
	case *hardwareFile != "" && *gpuFile == "":
		hw, err := readHardware(*hardwareFile)
		if err != nil {
			log.Fatalf("deviceplugin: %v", err)
		}
		if *only < 0 || *only > hw.Devices {
			log.Fatalf("deviceplugin: --devices %d: 0 to the %d devices", *only, hw.Devices)
		}
		all = resources(hw, *only, *deviceNode)
	default:
		log.Fatalf("deviceplugin: one of --hardware and --gpus")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	for _, r := range all {
		if err := r.serve(ctx, *dir); err != nil {
			log.Fatalf("deviceplugin: %s: %v", r.name, err)
		}
		log.Printf("deviceplugin: %s: %d devices registered", r.name, len(r.ids))
	}
	<-ctx.Done()
}

func readHardware(path string) (hardware, error) {
	var hw hardware
	text, err := os.ReadFile(path)
	if err != nil {
		return hw, err
	}
	if err := json.Unmarshal(text, &hw); err != nil {
		return hw, fmt.Errorf("%s: %v", path, err)
	}
	// Bounds before the lists are built: the largest instance has 16 devices of 8 cores.
	if hw.Devices < 1 || hw.Devices > 64 || hw.CoresPerDevice < 1 || hw.CoresPerDevice > 16 || len(hw.EfaDevices) > 64 {
		return hw, fmt.Errorf("%s: implausible hardware %+v", path, hw)
	}
	return hw, nil
}

func readGPUs(path string) (gpus, error) {
	var g gpus
	text, err := os.ReadFile(path)
	if err != nil {
		return g, err
	}
	if err := json.Unmarshal(text, &g); err != nil {
		return g, fmt.Errorf("%s: %v", path, err)
	}
	// The fake library's bound; a UUID is GPU- and 36 characters.
	if len(g.GPUs) < 1 || len(g.GPUs) > 64 {
		return g, fmt.Errorf("%s: %d GPUs", path, len(g.GPUs))
	}
	for _, gpu := range g.GPUs {
		if !strings.HasPrefix(gpu.UUID, "GPU-") || len(gpu.UUID) != 40 || gpu.Minor < 0 || gpu.Minor > 255 {
			return g, fmt.Errorf("%s: implausible GPU %+v", path, gpu)
		}
	}
	return g, nil
}

// gpuResources: what NVIDIA's device plugin advertises (default `uuid` id strategy,
// `envvar` list strategy), device nodes added as the Neuron ones are.
func gpuResources(g gpus, replicas int, deviceNode string) []*resource {
	minor := map[string]int{}
	for _, gpu := range g.GPUs {
		minor[gpu.UUID] = gpu.Minor
	}
	allocate := func(ids []string) *api.ContainerAllocateResponse {
		out := &api.ContainerAllocateResponse{}
		var visible []string
		seen := map[string]bool{}
		for _, id := range ids {
			// A replica of a shared GPU is the GPU itself to the container.
			uuid, _, _ := strings.Cut(id, "::")
			if m, ok := minor[uuid]; ok && !seen[uuid] {
				seen[uuid] = true
				visible = append(visible, uuid)
				out.Devices = append(out.Devices, &api.DeviceSpec{ContainerPath: fmt.Sprintf("/dev/nvidia%d", m), HostPath: deviceNode, Permissions: "rw"})
			}
		}
		out.Devices = append(out.Devices, &api.DeviceSpec{ContainerPath: "/dev/nvidiactl", HostPath: deviceNode, Permissions: "rw"})
		out.Envs = map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(visible, ",")}
		return out
	}
	var whole, shared []string
	for i, gpu := range g.GPUs {
		if replicas > 0 && i == len(g.GPUs)-1 {
			for r := 0; r < replicas; r++ {
				shared = append(shared, fmt.Sprintf("%s::%d", gpu.UUID, r))
			}
			continue
		}
		whole = append(whole, gpu.UUID)
	}
	all := []*resource{{name: "nvidia.com/gpu", socket: "neuron-sim-nvidia-gpu.sock", ids: whole, allocate: allocate}}
	if len(shared) > 0 {
		all = append(all, &resource{name: "nvidia.com/gpu.shared", socket: "neuron-sim-nvidia-gpu-shared.sock", ids: shared, allocate: allocate})
	}
	return all
}

// resources are the Neuron and EFA resources of hw; only the first `only` Neuron devices
// where only > 0.
func resources(hw hardware, only int, deviceNode string) []*resource {
	neuronNode := func(device int) *api.DeviceSpec {
		return &api.DeviceSpec{ContainerPath: fmt.Sprintf("/dev/neuron%d", device), HostPath: deviceNode, Permissions: "rw"}
	}
	advertised := hw.Devices
	if only > 0 {
		advertised = only
	}
	devices, cores := indices(advertised), indices(advertised*hw.CoresPerDevice)
	neuron := func(ids []string) *api.ContainerAllocateResponse {
		var held []int
		out := &api.ContainerAllocateResponse{}
		for _, d := range numbers(ids) {
			out.Devices = append(out.Devices, neuronNode(d))
			for c := d * hw.CoresPerDevice; c < (d+1)*hw.CoresPerDevice; c++ {
				held = append(held, c)
			}
		}
		out.Envs = map[string]string{"AWS_NEURON_VISIBLE_DEVICES": strings.Join(ids, ","), "NEURON_RT_VISIBLE_CORES": list(held)}
		return out
	}
	neuroncore := func(ids []string) *api.ContainerAllocateResponse {
		held := numbers(ids)
		out := &api.ContainerAllocateResponse{Envs: map[string]string{"NEURON_RT_VISIBLE_CORES": list(held)}}
		seen := map[int]bool{}
		for _, c := range held {
			if d := c / hw.CoresPerDevice; !seen[d] {
				seen[d] = true
				out.Devices = append(out.Devices, neuronNode(d))
			}
		}
		return out
	}
	efa := func(ids []string) *api.ContainerAllocateResponse {
		out := &api.ContainerAllocateResponse{}
		for _, id := range ids {
			for k, name := range hw.EfaDevices {
				if name == id {
					out.Devices = append(out.Devices, &api.DeviceSpec{ContainerPath: fmt.Sprintf("/dev/infiniband/uverbs%d", k), HostPath: deviceNode, Permissions: "rw"})
				}
			}
		}
		return out
	}
	all := []*resource{
		{name: "aws.amazon.com/neuron", socket: "neuron-sim-neuron.sock", ids: devices, allocate: neuron, contiguous: true},
		{name: "aws.amazon.com/neuroncore", socket: "neuron-sim-neuroncore.sock", ids: cores, allocate: neuroncore, contiguous: true},
	}
	if len(hw.EfaDevices) > 0 {
		all = append(all, &resource{name: "vpc.amazonaws.com/efa", socket: "neuron-sim-efa.sock", ids: hw.EfaDevices, allocate: efa})
	}
	return all
}

// serve starts the resource's gRPC server on its socket and registers it with the kubelet.
func (r *resource) serve(ctx context.Context, dir string) error {
	path := filepath.Join(dir, r.socket)
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, r)
	go func() { _ = server.Serve(listener) }()
	go func() { <-ctx.Done(); server.Stop(); _ = os.Remove(path) }()

	dial, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = api.NewRegistrationClient(conn).Register(dial, &api.RegisterRequest{
		Version: api.Version, Endpoint: r.socket, ResourceName: r.name,
		Options: &api.DevicePluginOptions{GetPreferredAllocationAvailable: r.contiguous},
	})
	return err
}

func (r *resource) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{GetPreferredAllocationAvailable: r.contiguous}, nil
}

// GetPreferredAllocation prefers, as AWS's plugin does, a contiguous run of indices
// (the Neuron runtime's NEURON_RT_VISIBLE_CORES is a range): the lowest run of free ids
// holding the ones the kubelet must include, else the kubelet's own choice.
func (r *resource) GetPreferredAllocation(_ context.Context, request *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	out := &api.PreferredAllocationResponse{}
	for _, c := range request.ContainerRequests {
		out.ContainerResponses = append(out.ContainerResponses, &api.ContainerPreferredAllocationResponse{
			DeviceIDs: contiguous(numbers(c.AvailableDeviceIDs), numbers(c.MustIncludeDeviceIDs), int(c.AllocationSize)),
		})
	}
	return out, nil
}

// contiguous is the first run of `size` consecutive free indices containing every one of
// `must`; none when there is no such run (the kubelet then chooses).
func contiguous(free, must []int, size int) []string {
	isFree := map[int]bool{}
	for _, f := range free {
		isFree[f] = true
	}
	for _, start := range free {
		run := true
		for i := start; i < start+size && run; i++ {
			run = isFree[i]
		}
		for _, m := range must {
			run = run && m >= start && m < start+size
		}
		if run {
			ids := make([]int, size)
			for i := range ids {
				ids[i] = start + i
			}
			return strings.Split(list(ids), ",")
		}
	}
	return nil
}

// ListAndWatch sends the devices, all healthy, and holds the stream open.
func (r *resource) ListAndWatch(_ *api.Empty, stream grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	response := &api.ListAndWatchResponse{}
	for _, id := range r.ids {
		response.Devices = append(response.Devices, &api.Device{ID: id, Health: api.Healthy})
	}
	if err := stream.Send(response); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (r *resource) Allocate(_ context.Context, request *api.AllocateRequest) (*api.AllocateResponse, error) {
	out := &api.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		log.Printf("deviceplugin: %s: allocating %v", r.name, container.DevicesIds)
		out.ContainerResponses = append(out.ContainerResponses, r.allocate(container.DevicesIds))
	}
	return out, nil
}

func (r *resource) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

func indices(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out
}

// numbers are the ids as indices, sorted; the kubelet passes only ids this plugin listed.
func numbers(ids []string) []int {
	var out []int
	for _, id := range ids {
		if n, err := strconv.Atoi(id); err == nil {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out
}

func list(cores []int) string {
	parts := make([]string, len(cores))
	for i, c := range cores {
		parts[i] = strconv.Itoa(c)
	}
	return strings.Join(parts, ",")
}
