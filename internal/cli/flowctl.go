package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ofsdn/ofsdn/flowctl"
)

// Flowctl is flowctl's command line: it inspects an ofsdn bridge and administers pod networks. See
// flowctl/.
func Flowctl(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := flowctl.Main(ctx, args, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flowctl.ErrDifferences) {
			return 1 // as diff(1): the report says what differs
		}
		fmt.Fprintln(os.Stderr, "flowctl:", err)
		return 1
	}
	return 0
}
