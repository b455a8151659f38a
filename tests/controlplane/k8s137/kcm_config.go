package main

// The one call whose signature differs between the tier's Kubernetes versions: 1.37's
// takes the context (../kcm_config.go, 1.33, does not). main.go links to ../main.go.

import (
	"context"

	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmconfig "k8s.io/kubernetes/cmd/kube-controller-manager/app/config"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

func controllerManagerConfig(ctx context.Context, kcm *kcmoptions.KubeControllerManagerOptions) (*kcmconfig.Config, error) {
	return kcm.Config(ctx, kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
}
