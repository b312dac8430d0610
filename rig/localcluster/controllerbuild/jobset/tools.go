//go:build tools

// Package jobsetbuild exists only so that `go build` can build sigs.k8s.io/jobset from the
// pinned module; nothing imports it.
package jobsetbuild

import _ "sigs.k8s.io/jobset"
