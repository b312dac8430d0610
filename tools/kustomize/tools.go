//go:build tools

// Package tools pins the kustomize CLI (the one kubectl v1.32 embeds, v5.5.0) that
// tests/tool_binaries.py builds into $HOLDWARDEN_CACHE: the manifests are rendered by the
// real kustomize, not by a re-implementation.
package tools

import _ "sigs.k8s.io/kustomize/kustomize/v5"
