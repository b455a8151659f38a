package main

// The one call whose signature differs between the tier's Kubernetes versions: this
// module's (1.33) takes no context; k8s137/kcm_config.go's does. main.go is shared (the
// k8s137 module's main.go is a link to this one).

import (
	"context"

	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmconfig "k8s.io/kubernetes/cmd/kube-controller-manager/app/config"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

func controllerManagerConfig(_ context.Context, kcm *kcmoptions.KubeControllerManagerOptions) (*kcmconfig.Config, error) {
	return kcm.Config(kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
}
