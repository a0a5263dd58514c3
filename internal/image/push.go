package image

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push uploads img to a registry as ref (name:tag), with the credentials `docker login` or a
// credential helper keeps (~/.docker/config.json), and returns the reference by digest that deploy/'s
// overlay names. insecure allows plain HTTP (a registry on localhost, a lab).
func Push(ctx context.Context, img v1.Image, ref string, insecure bool) (string, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	tag, err := name.NewTag(ref, opts...)
	if err != nil {
		return "", fmt.Errorf("image: push: %w", err)
	}
	if err := remote.Write(tag, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return "", fmt.Errorf("image: push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("image: push: %w", err)
	}
	return tag.Context().Digest(d.String()).String(), nil
}
