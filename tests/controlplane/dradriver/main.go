// Command dradriver stands in, on the tests' real node, for AWS's Neuron DRA driver
// (`neuron.aws.com`), which cannot run without the hardware. It is a kubelet plugin
// (k8s.io/dynamic-resource-allocation/kubeletplugin: registration with the kubelet's
// plugin registry, the DRA gRPC service, ResourceSlice publishing) that
//
//   - creates the DeviceClass neuron.aws.com (devices of the driver) if it is absent;
//   - publishes one pool (named after the node) with the simulated instance type's Neuron
//     devices, named neurondevice<N>, with the attributes AWS's driver publishes:
//     deviceId, instanceType, neuronDriverVersion, resourceType (neuron_device) and the
//     topology groups resource.aws.com/devicegroup4_id and devicegroup8_id;
//   - prepares a claim by writing a CDI spec (--cdi-dir) whose one device, named after the
//     claim's UID, gives the container AWS_NEURON_VISIBLE_DEVICES and
//     NEURON_RT_VISIBLE_CORES of the claimed devices (what the device plugin's Allocate
//     gives, and what `neuron-monitor-sim app` reads), and unprepares it by removing it.
//
// Where the instance type has EFA devices, the same process also stands in for AWS's EFA
// DRA driver (efa.go): driver dra.net, DeviceClass efa.networking.k8s.aws (not with
// --efa=false).
//
// With --first-device N it publishes the Neuron devices from index N on: on a mixed node
// the test device plugin advertises the others (`deviceplugin --devices N`).
//
// The hardware comes from `neuron-monitor-sim hardware` (--hardware), as for the test
// device plugin.
//
// The node's containerd (1.6, Debian's) has no CDI support and the kubelet passes CDI
// devices only in the CRI field containerd 1.6 does not read; so the driver also records
// which pods consume each claim (--consumers-dir, from the claim's reservedFor), and
// `dradriver runc ...` (containerd's runc BinaryName on a DRA node) applies, before runc
// creates a pod's container, the environment of the CDI devices recorded for the pod:
// the CDI injection a runtime with CDI support does.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

const (
	driverName = "neuron.aws.com"
	// The CDI kind of the claims' devices: <vendor>/<class>.
	cdiKind = driverName + "/claim"
	// Device names as AWS's driver gives them.
	devicePrefix = "neurondevice"
)

// hardware is what `neuron-monitor-sim hardware` prints.
type hardware struct {
	InstanceType   string   `json:"instance_type"`
	Devices        int      `json:"devices"`
	CoresPerDevice int      `json:"cores_per_device"`
	EfaDevices     []string `json:"efa_devices"`
}

type driver struct {
	hw hardware
	// The first device index published (the ones before are the device plugin's).
	first        int
	cdiDir       string
	consumersDir string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "runc" {
		os.Exit(runc(os.Args[2:]))
	}
	hardwareFile := flag.String("hardware", "", "JSON of `neuron-monitor-sim hardware`")
	nodeName := flag.String("node-name", "", "the node whose devices are published")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the driver's API access")
	driverVersion := flag.String("driver-version", "", "the Neuron driver version published (neuronDriverVersion)")
	cdiDir := flag.String("cdi-dir", "", "where the claims' CDI specs are written")
	consumersDir := flag.String("consumers-dir", "", "where the pods consuming each claim are recorded (for `dradriver runc`)")
	registryDir := flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	pluginDir := flag.String("plugin-dir", filepath.Join(kubeletplugin.KubeletPluginsDir, driverName), "the driver's socket directory")
	firstDevice := flag.Int("first-device", 0, "publish the Neuron devices from this index on (the device plugin advertises the others)")
	withEfa := flag.Bool("efa", true, "stand in for AWS's EFA DRA driver too, where the instance type has EFA devices")
	flag.Parse()
	if *hardwareFile == "" || *nodeName == "" || *kubeconfig == "" || *cdiDir == "" || *consumersDir == "" {
		log.Fatalf("dradriver: --hardware, --node-name, --kubeconfig, --cdi-dir and --consumers-dir are needed")
	}
	hw, err := readHardware(*hardwareFile)
	if err != nil {
		log.Fatalf("dradriver: %v", err)
	}
	if *firstDevice < 0 || *firstDevice >= hw.Devices {
		log.Fatalf("dradriver: --first-device %d: 0 to %d", *firstDevice, hw.Devices-1)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("dradriver: %v", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatalf("dradriver: %v", err)
	}
	for _, d := range []string{*cdiDir, *consumersDir, *registryDir, *pluginDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			log.Fatalf("dradriver: %v", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := ensureDeviceClass(ctx, client, driverName, fmt.Sprintf("device.driver == %q", driverName)); err != nil {
		log.Fatalf("dradriver: DeviceClass %s: %v", driverName, err)
	}
	d := &driver{hw: hw, first: *firstDevice, cdiDir: *cdiDir, consumersDir: *consumersDir}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(driverName), kubeletplugin.NodeName(*nodeName), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(*registryDir), kubeletplugin.PluginDataDirectoryPath(*pluginDir))
	if err != nil {
		log.Fatalf("dradriver: starting the kubelet plugin: %v", err)
	}
	defer helper.Stop()
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: d.devices(*driverVersion)}}}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{*nodeName: pool}}); err != nil {
		log.Fatalf("dradriver: publishing the ResourceSlice: %v", err)
	}
	log.Printf("dradriver: %s: %d devices published in pool %s", driverName, hw.Devices-d.first, *nodeName)
	if *withEfa && len(hw.EfaDevices) > 0 {
		stopEfa, err := startEfa(ctx, client, hw, *nodeName, *registryDir, filepath.Join(filepath.Dir(*pluginDir), efaDriverName))
		if err != nil {
			log.Fatalf("dradriver: %s: %v", efaDriverName, err)
		}
		defer stopEfa()
	}
	<-ctx.Done()
}

// startEfa starts the EFA half: its DeviceClass, its kubelet plugin and its ResourceSlice.
func startEfa(ctx context.Context, client kubernetes.Interface, hw hardware, nodeName, registryDir, pluginDir string) (func(), error) {
	if err := os.MkdirAll(pluginDir, 0o755); err != nil {
		return nil, err
	}
	if err := ensureDeviceClass(ctx, client, efaDeviceClass, efaDeviceClassSelector()); err != nil {
		return nil, fmt.Errorf("DeviceClass %s: %v", efaDeviceClass, err)
	}
	devices, byName := efaDevices(hw.EfaDevices)
	helper, err := kubeletplugin.Start(ctx, &efaDriver{devices: byName},
		kubeletplugin.DriverName(efaDriverName), kubeletplugin.NodeName(nodeName), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registryDir), kubeletplugin.PluginDataDirectoryPath(pluginDir))
	if err != nil {
		return nil, fmt.Errorf("starting the kubelet plugin: %v", err)
	}
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices}}}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: pool}}); err != nil {
		helper.Stop()
		return nil, fmt.Errorf("publishing the ResourceSlice: %v", err)
	}
	log.Printf("dradriver: %s: %d EFA devices published in pool %s", efaDriverName, len(devices), nodeName)
	return helper.Stop, nil
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
	// The largest instance has 16 devices of 8 cores; a slice holds at most 128 devices.
	if hw.Devices < 1 || hw.Devices > 64 || hw.CoresPerDevice < 1 || hw.CoresPerDevice > 16 || len(hw.EfaDevices) > 64 {
		return hw, fmt.Errorf("%s: implausible hardware %+v", path, hw)
	}
	return hw, nil
}

// ensureDeviceClass creates the DeviceClass `name` selecting devices by the CEL
// `expression`, as AWS's charts do; an existing one is kept.
func ensureDeviceClass(ctx context.Context, client kubernetes.Interface, name, expression string) error {
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: expression},
		}}},
	}
	_, err := client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// devices are the published Neuron devices with AWS's attributes.
func (d *driver) devices(driverVersion string) []resourceapi.Device {
	hw := d.hw
	var out []resourceapi.Device
	for i := d.first; i < hw.Devices; i++ {
		out = append(out, resourceapi.Device{
			Name: fmt.Sprintf("%s%d", devicePrefix, i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"deviceId":                         {IntValue: ptr.To(int64(i))},
				"instanceType":                     {StringValue: ptr.To(hw.InstanceType)},
				"neuronDriverVersion":              {StringValue: ptr.To(driverVersion)},
				"resourceType":                     {StringValue: ptr.To("neuron_device")},
				"resource.aws.com/devicegroup4_id": {IntValue: ptr.To(int64(i / 4))},
				"resource.aws.com/devicegroup8_id": {IntValue: ptr.To(int64(i / 8))},
			},
		})
	}
	return out
}

// PrepareResourceClaims writes each claim's CDI spec and records its consumers.
func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		result, err := d.prepare(claim)
		if err != nil {
			log.Printf("dradriver: claim %s/%s: %v", claim.Namespace, claim.Name, err)
			result = kubeletplugin.PrepareResult{Err: err}
		}
		out[claim.UID] = result
	}
	return out, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, error) {
	var result kubeletplugin.PrepareResult
	if claim.Status.Allocation == nil {
		return result, errors.New("not allocated")
	}
	cdiID := cdiKind + "=" + string(claim.UID)
	var indices []int
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driverName {
			continue
		}
		index, err := d.index(r.Device)
		if err != nil {
			return result, err
		}
		indices = append(indices, index)
		result.Devices = append(result.Devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{cdiID},
		})
	}
	sort.Ints(indices)
	if err := d.writeSpec(claim.UID, indices); err != nil {
		return result, err
	}
	for _, consumer := range claim.Status.ReservedFor {
		if consumer.Resource != "pods" {
			continue
		}
		dir := filepath.Join(d.consumersDir, podKey(claim.Namespace, consumer.Name))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return result, err
		}
		if err := os.WriteFile(filepath.Join(dir, string(claim.UID)), []byte(cdiID), 0o644); err != nil {
			return result, err
		}
	}
	log.Printf("dradriver: claim %s/%s prepared: devices %v", claim.Namespace, claim.Name, indices)
	return result, nil
}

// index is a published device name's Neuron device index.
func (d *driver) index(name string) (int, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(name, devicePrefix))
	if err != nil || !strings.HasPrefix(name, devicePrefix) || i < d.first || i >= d.hw.Devices {
		return 0, fmt.Errorf("device %q is not one this driver publishes", name)
	}
	return i, nil
}

// cdiSpec is a CDI specification with what this driver sets: one device per claim, its
// container edits the environment.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string `json:"name"`
	ContainerEdits struct {
		Env []string `json:"env"`
	} `json:"containerEdits"`
}

// writeSpec writes, atomically, the CDI spec of a claim holding the devices `indices`.
func (d *driver) writeSpec(uid types.UID, indices []int) error {
	var ids, cores []string
	for _, i := range indices {
		ids = append(ids, strconv.Itoa(i))
		for c := i * d.hw.CoresPerDevice; c < (i+1)*d.hw.CoresPerDevice; c++ {
			cores = append(cores, strconv.Itoa(c))
		}
	}
	device := cdiDevice{Name: string(uid)}
	device.ContainerEdits.Env = []string{
		"AWS_NEURON_VISIBLE_DEVICES=" + strings.Join(ids, ","), "NEURON_RT_VISIBLE_CORES=" + strings.Join(cores, ","),
	}
	text, err := json.Marshal(cdiSpec{Version: "0.6.0", Kind: cdiKind, Devices: []cdiDevice{device}})
	if err != nil {
		return err
	}
	path := specPath(d.cdiDir, uid)
	if err := os.WriteFile(path+".tmp", text, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func specPath(dir string, uid types.UID) string {
	return filepath.Join(dir, "neuron.aws.com-"+string(uid)+".json")
}

// podKey names a pod's consumers directory (a namespace holds no `_`).
func podKey(namespace, pod string) string { return namespace + "_" + pod }

// UnprepareResourceClaims removes the claims' CDI specs and consumer records; a claim
// not prepared is no error.
func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, claim := range claims {
		err := os.Remove(specPath(d.cdiDir, claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		records, _ := filepath.Glob(filepath.Join(d.consumersDir, "*", string(claim.UID)))
		for _, r := range records {
			_ = os.Remove(r)
			_ = os.Remove(filepath.Dir(r)) // only when empty
		}
		log.Printf("dradriver: claim %s/%s unprepared", claim.Namespace, claim.Name)
		out[claim.UID] = err
	}
	return out, nil
}

// HandleError logs background errors (ResourceSlice publishing); the controller retries.
func (d *driver) HandleError(_ context.Context, err error, msg string) {
	log.Printf("dradriver: %s: %v", msg, err)
}
