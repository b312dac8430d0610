//go:build tools

// Package kueuebuild exists only so that `go build` can build sigs.k8s.io/kueue/cmd/kueue from the
// pinned module; nothing imports it.
package kueuebuild

import _ "sigs.k8s.io/kueue/cmd/kueue"
