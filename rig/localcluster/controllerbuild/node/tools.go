//go:build tools

// Package nodebuild exists only so that `go build` can build kubelet and kube-proxy from
// the pinned k8s.io/kubernetes module (the same one as kube-controller-manager); nothing
// imports it.
package nodebuild

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
