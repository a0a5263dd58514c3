// Command mkimage builds ofsdn's container image without a container runtime: `make image`. See
// internal/image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/ofsdn/ofsdn/internal/image"
)

func main() {
	var opts image.Options
	flag.StringVar(&opts.OutDir, "out", "_output/image", "directory for the OCI layout (oci/) and the tarball")
	flag.StringVar(&opts.Name, "name", image.DefaultName, "image name, without tag (the tag is the version)")
	flag.StringVar(&opts.Source, "source", image.DefaultSource, "org.opencontainers.image.source label")
	flag.StringVar(&opts.Arch, "arch", "", "GOARCH to build for (default: this machine's)")
	flag.StringVar(&opts.Version, "version", "", "version label and tag (default: git describe --tags --always --dirty)")
	flag.StringVar(&opts.Revision, "revision", "", "commit label (default: git rev-parse HEAD); with --version and SOURCE_DATE_EPOCH, no git is needed")
	push := flag.Bool("push", false, "also push the image to the registry its --name names, as name:version")
	ovs := flag.Bool("ovs", false, "build the Open vSwitch image (deploy/ovs) instead: Debian's Open vSwitch and ofsdn-ovs")
	insecure := flag.Bool("insecure", false, "with --push, allow a registry over plain HTTP")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, *ovs, *push, *insecure); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, opts image.Options, ovs, push, insecure bool) error {
	root, err := image.RepoRoot(ctx)
	if err != nil {
		return err
	}
	opts.RepoRoot, opts.Log = root, os.Stderr
	var res *image.Result
	if ovs {
		if opts.Name == image.DefaultName {
			opts.Name = image.DefaultOVSName
		}
		res, err = image.BuildOVS(ctx, opts, filepath.Join(root, "_output", "debs"))
	} else {
		res, err = image.Build(ctx, opts)
	}
	if err != nil {
		return err
	}
	fmt.Print(res.Summary())
	if !push {
		return nil
	}
	img, err := image.ReadLayout(res.Layout)
	if err != nil {
		return err
	}
	byDigest, err := image.Push(ctx, img, res.Ref, insecure)
	if err != nil {
		return err
	}
	fmt.Printf("pushed   %s\n         %s  (images: newName/digest in your deploy/ overlay)\n", res.Ref, byDigest)
	return nil
}
