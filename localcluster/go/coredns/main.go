// Command coredns runs CoreDNS (github.com/coredns/coredns) with the plugins a cluster's DNS
// uses, as its own Corefile for Kubernetes does (errors, health, ready, kubernetes, forward,
// cache, loop), and bind, to answer on the node's address only. Its full build also links
// every cloud provider's SDK, which the local cluster's real node does not need.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
