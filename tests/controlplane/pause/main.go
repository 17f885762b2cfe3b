// Command pause is the pod sandbox ("pause") image's only program on the test
// node (tests/realnode.sh): it holds the pod's namespaces, reaps the children
// it inherits as the namespace's PID 1, and exits on SIGTERM/SIGINT. Built
// static (CGO_ENABLED=0) so the image needs no library.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
