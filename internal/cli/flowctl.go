package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ofsdn/ofsdn/flowctl"
)

// Flowctl is flowctl's command line: it inspects an ofsdn bridge and administers pod networks. See
// flowctl/ (its exit statuses: flowctl.Run).
func Flowctl(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return flowctl.Run(ctx, args, os.Stdout, os.Stderr)
}
