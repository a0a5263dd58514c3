// Command ofsdn-lab-images builds the images the lab's real kubelets run (e2e/labimages) into a
// directory of tarballs for `ctr images import`, and prints each image's name, digest and tarball.
//
//	ofsdn-lab-images [--out _output/lab-images]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ofsdn/ofsdn/e2e/labimages"
	"github.com/ofsdn/ofsdn/lab/kubelab"
)

func main() {
	out := flag.String("out", "_output/lab-images", "directory for the image tarballs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root, err := kubelab.RepoRoot()
	if err == nil {
		var imgs []labimages.Image
		imgs, err = labimages.Build(ctx, labimages.Options{RepoRoot: root, OutDir: *out,
			Log: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }})
		for _, img := range imgs {
			fmt.Printf("%-60s %s %6.1f MB %s\n", img.Ref, img.Digest[:19], float64(img.Size)/1e6, img.Tarball)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-lab-images:", err)
		os.Exit(1)
	}
}
