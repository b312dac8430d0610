//go:build tools

// Package kubebuild exists only so that `go build` can build kube-apiserver from the
// pinned k8s.io/kubernetes module; nothing imports it.
package kubebuild

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
