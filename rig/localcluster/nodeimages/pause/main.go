// Command pause is the real node's sandbox ("pause") image: it holds a Pod's namespaces
// and does nothing else until it is told to stop. Static, standard library only, so the
// image is this one file (rig/localcluster/images.py builds it; no base image is pulled).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	// As PID 1 of the Pod's PID namespace, reap whatever is re-parented to us.
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
