//go:build tools

// Package kwokbuild exists only so that `go build` can build kwok, the project that plays
// the kubelets of fake nodes (heartbeats, pods Running, graceful termination), from the
// pinned sigs.k8s.io/kwok module; nothing imports it.
package kwokbuild

import _ "sigs.k8s.io/kwok/cmd/kwok"
