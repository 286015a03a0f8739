package testimage

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteOCIArchive writes img as an oci-archive (a tar of an OCI image layout)
// at path, naming it ref in the index annotations (both the OCI ref.name
// and containerd's image.name). ref "" leaves it unnamed.
func WriteOCIArchive(img v1.Image, ref, path string) error {
	dir, err := os.MkdirTemp("", "testimage-oci-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref,
			"io.containerd.image.name":          ref,
		}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		return err
	}
	return tarDir(dir, path)
}

// tarDir writes the files under dir into a tar at path.
func tarDir(dir, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteDockerArchive writes img as a docker-archive (docker save format)
// tagged ref at path.
func WriteDockerArchive(img v1.Image, ref, path string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("tag %q: %w", ref, err)
	}
	return tarball.WriteToFile(path, tag, img)
}

// ServeRegistry starts an in-process registry on 127.0.0.1, closed by
// t.Cleanup, and returns its host:port.
func ServeRegistry(t testing.TB) (host string) {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Push uploads img to ref (plain HTTP allowed).
func Push(img v1.Image, ref string) error {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	return remote.Write(r, img)
}

// BusyboxT is Busybox for tests: it skips when /bin/busybox is missing
// (fails when CI=true) and fails on other errors.
func BusyboxT(t testing.TB) v1.Image {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	img, err := Busybox()
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// WithFilesT is WithFiles that fails t on error.
func WithFilesT(t testing.TB, base v1.Image, files map[string]string) v1.Image {
	t.Helper()
	img, err := WithFiles(base, files)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// PushT serves a registry (see ServeRegistry), pushes img as repo:tag to it
// and returns the full reference ("127.0.0.1:PORT/repo:tag").
func PushT(t testing.TB, img v1.Image, repoTag string) string {
	t.Helper()
	ref := ServeRegistry(t) + "/" + repoTag
	if err := Push(img, ref); err != nil {
		t.Fatal(err)
	}
	return ref
}
