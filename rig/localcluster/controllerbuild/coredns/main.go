// Command coredns is CoreDNS v1.13.1 with only the plugins the real node's cluster DNS
// uses, so that its build compiles a small part of CoreDNS's dependency graph: bind (the
// run's own address), ready (the rig waits on it), errors, cache and kubernetes (Services
// and Pods of the cluster domain). Nothing is forwarded: the node reaches no upstream.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The chain's order, as in CoreDNS's own plugin list, of the plugins linked here.
	dnsserver.Directives = []string{"bind", "ready", "errors", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
