package testimage

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestBusyboxDeterministic(t *testing.T) {
	a, b := BusyboxT(t), BusyboxT(t)
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("digests differ: %s vs %s", da, db)
	}
	cf, err := a.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Cmd, []string{"/bin/sh"}) || cf.OS != "linux" {
		t.Errorf("config: %+v", cf.Config)
	}
	names := layerNames(t, a, 0)
	for _, want := range []string{"bin/busybox", "bin/sh", "bin/ls", "etc/passwd", "tmp/"} {
		if !names[want] {
			t.Errorf("layer lacks %s", want)
		}
	}
}

func layerNames(t *testing.T, img v1.Image, i int) map[string]bool {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := ls[i].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	names := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
}

// extract unpacks the regular files of a tar into dir.
func extract(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		p := filepath.Join(dir, filepath.Clean(h.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
}

func TestWithFilesWhiteouts(t *testing.T) {
	img := WithFilesT(t, BusyboxT(t), map[string]string{
		"etc/gone": Whiteout, "opq/": Opaque, "a/b/c": "x",
	})
	ls, _ := img.Layers()
	if len(ls) != 2 {
		t.Fatalf("%d layers, want 2", len(ls))
	}
	rc, err := ls[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.Name)
	}
	want := []string{"a/", "a/b/", "a/b/c", "etc/", "etc/.wh.gone", "opq/", "opq/.wh..wh..opq"}
	if !slices.Equal(got, want) {
		t.Errorf("entries = %v, want %v", got, want)
	}
}

func TestArchivesAndRegistry(t *testing.T) {
	img := BusyboxT(t)
	want, _ := img.Digest()
	dir := t.TempDir()

	oci := filepath.Join(dir, "oci.tar")
	if err := WriteOCIArchive(img, "x/y:z", oci); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "layout")
	if err := extract(oci, out); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	im, _ := idx.IndexManifest()
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != want || im.Manifests[0].Annotations["io.containerd.image.name"] != "x/y:z" {
		t.Errorf("OCI index: %+v", im.Manifests)
	}

	docker := filepath.Join(dir, "docker.tar")
	if err := WriteDockerArchive(img, "x/y:z", docker); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("x/y:z")
	dimg, err := tarball.ImageFromPath(docker, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if cf, err := dimg.ConfigFile(); err != nil || cf.Config.Cmd[0] != "/bin/sh" {
		t.Errorf("docker archive config: %v", err)
	}

	ref := PushT(t, img, "a/busybox:1")
	r, _ := name.ParseReference(ref, name.Insecure)
	got, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := got.Digest(); d != want {
		t.Errorf("pulled digest %s, want %s", d, want)
	}
}
