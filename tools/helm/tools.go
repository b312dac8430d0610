//go:build tools

// Package tools pins the Helm CLI that tests/helm_binary.py builds into $HOLDWARDEN_CACHE.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
