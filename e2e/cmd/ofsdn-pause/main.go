// Command ofsdn-pause is the lab's pod sandbox ("pause") process, built from source because the lab
// pulls no images: it holds the pod's namespaces open, reaps the zombies a pod's processes leave when
// it is their PID 1, and exits 0 on SIGTERM or SIGINT, as Kubernetes' pause does.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("ofsdn-pause")
		return
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
