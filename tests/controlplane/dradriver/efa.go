package main

// The EFA half of the test DRA driver. On EKS, EFA devices are allocated through DRA by
// AWS's EFA DRA driver, DRANET (driver dra.net, DeviceClass efa.networking.k8s.aws),
// which cannot run without EFA hardware either. This half publishes the simulated
// instance type's EFA devices as DRANET does: named after their PCI address, each with
// the RDMA device's name (dra.net/rdmaDevice: the name under /sys/class/infiniband the
// agent reads), dra.net/rdma and dra.net/pciDevice (which AWS's DeviceClass selects on).
// A claim needs no preparation here beyond accepting it: the simulated application does
// not open the device.

import (
	"context"
	"fmt"
	"log"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
)

const (
	efaDriverName  = "dra.net"
	efaDeviceClass = "efa.networking.k8s.aws"
	// What DRANET publishes as an EFA device's dra.net/pciDevice.
	efaPCIDevice = "Elastic Fabric Adapter (EFA)"
)

// efaDriver prepares claims of the published EFA devices: name -> RDMA device name.
type efaDriver struct {
	devices map[string]string
}

// efaDeviceClassSelector is the CEL expression of AWS's DeviceClass: DRANET's EFA devices.
func efaDeviceClassSelector() string {
	return fmt.Sprintf("device.driver == %q && device.attributes[%q].pciDevice == %q", efaDriverName, efaDriverName, efaPCIDevice)
}

// efaDevices are the instance type's EFA devices as DRANET publishes them.
func efaDevices(rdmaNames []string) ([]resourceapi.Device, map[string]string) {
	out := make([]resourceapi.Device, len(rdmaNames))
	byName := map[string]string{}
	for k, rdma := range rdmaNames {
		name := fmt.Sprintf("pci-0000-%02x-00-0", 0x10+k)
		byName[name] = rdma
		out[k] = resourceapi.Device{
			Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"dra.net/rdmaDevice": {StringValue: ptr.To(rdma)},
				"dra.net/rdma":       {BoolValue: ptr.To(true)},
				"dra.net/pciDevice":  {StringValue: ptr.To(efaPCIDevice)},
			},
		}
	}
	return out, byName
}

// PrepareResourceClaims accepts the claims' devices of this driver that it publishes.
func (d *efaDriver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var result kubeletplugin.PrepareResult
		if claim.Status.Allocation == nil {
			result.Err = fmt.Errorf("claim %s/%s: not allocated", claim.Namespace, claim.Name)
		} else {
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Driver != efaDriverName {
					continue
				}
				if _, ok := d.devices[r.Device]; !ok {
					result.Err = fmt.Errorf("claim %s/%s: device %q is not one this driver publishes", claim.Namespace, claim.Name, r.Device)
					break
				}
				result.Devices = append(result.Devices, kubeletplugin.Device{
					Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
				})
			}
		}
		if result.Err != nil {
			log.Printf("dradriver: %s: %v", efaDriverName, result.Err)
		} else {
			log.Printf("dradriver: %s: claim %s/%s prepared: %d devices", efaDriverName, claim.Namespace, claim.Name, len(result.Devices))
		}
		out[claim.UID] = result
	}
	return out, nil
}

// UnprepareResourceClaims has nothing to undo.
func (d *efaDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, claim := range claims {
		out[claim.UID] = nil
	}
	return out, nil
}

// HandleError logs background errors (ResourceSlice publishing); the controller retries.
func (d *efaDriver) HandleError(_ context.Context, err error, msg string) {
	log.Printf("dradriver: %s: %s: %v", efaDriverName, msg, err)
}
