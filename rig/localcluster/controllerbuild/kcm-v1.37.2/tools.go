//go:build tools

// Package kcmbuild exists only so that `go build` can build kube-controller-manager from
// the pinned k8s.io/kubernetes module; nothing imports it.
package kcmbuild

import _ "k8s.io/kubernetes/cmd/kube-controller-manager"
