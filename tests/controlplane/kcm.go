package main

import (
	"context"

	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmconfig "k8s.io/kubernetes/cmd/kube-controller-manager/app/config"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

// controllerManagerConfig is the controller manager's completed configuration. The call
// differs across releases (newer ones take a context): a release whose call differs has a
// file of this name in k8s-versions/<version>/, which replaces this one in its build.
func controllerManagerConfig(ctx context.Context, s *kcmoptions.KubeControllerManagerOptions) (*kcmconfig.CompletedConfig, error) {
	c, err := s.Config(ctx, kcm.KnownControllers(), kcm.ControllersDisabledByDefault(), kcm.ControllerAliases())
	if err != nil {
		return nil, err
	}
	return c.Complete(), nil
}
