//go:build tools

// Package etcdbuild exists only so that `go build` can build etcd v3.6.8, the etcd that
// Kubernetes 1.36's own client (go.etcd.io/etcd/client/v3 v3.6.8) is built with, from the
// pinned module; nothing imports it.
package etcdbuild

import _ "go.etcd.io/etcd/server/v3"
