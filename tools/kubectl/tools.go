//go:build tools

// Package tools pins the kubectl CLI that tests/tool_binaries.py builds into
// $HOLDWARDEN_CACHE, from the same k8s.io/kubernetes release as the control plane.
package tools

import _ "k8s.io/kubernetes/cmd/kubectl"
