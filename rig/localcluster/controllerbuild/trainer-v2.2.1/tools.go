//go:build tools

// Package trainerbuild exists only so that `go build` can build github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager from the
// pinned module; nothing imports it.
package trainerbuild

import _ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
