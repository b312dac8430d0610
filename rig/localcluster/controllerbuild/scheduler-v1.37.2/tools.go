//go:build tools

// Package schedulerbuild exists only so that `go build` can build kube-scheduler from the
// pinned k8s.io/kubernetes module (the same one as kube-controller-manager); nothing
// imports it.
package schedulerbuild

import _ "k8s.io/kubernetes/cmd/kube-scheduler"
