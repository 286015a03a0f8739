package image

import (
	"archive/tar"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenRepairsDamagedTmp: an older version could be made (by a layer
// entry ".wh...") to put a device node in place of tmp/, after which the
// daemon could not start. Open replaces it, and keeps the store private.
func TestOpenRepairsDamagedTmp(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(s.tmpDir(), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	os.Chmod(s.root, 0o755)
	s2, err := Open(ctx, s.root, nil)
	if err != nil {
		t.Fatalf("Open with a device node as tmp: %v", err)
	}
	for _, d := range []string{s2.root, s2.layersDir(), s2.tmpDir()} {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want a 0700 directory", d, fi.Mode(), err)
		}
	}
	if _, err := s2.Import(ctx, ociBuild{layers: [][]byte{layerTar(t, "f", 1)}}.write(t, "example.com/a:1"), "", nil); err != nil {
		t.Errorf("import after repair: %v", err)
	}
}

// TestMigrateOldLayout opens a store written with 12-digit layer names,
// including a migration interrupted half-way and a never-completed layer.
func TestMigrateOldLayout(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	var imgs []Image
	for i, f := range []string{"a", "b", "c"} {
		img, err := s.Import(ctx, ociBuild{layers: [][]byte{layerTar(t, f, 10)}}.write(t, "example.com/"+f+":1"), "", nil)
		if err != nil {
			t.Fatal(i, err)
		}
		imgs = append(imgs, img)
	}
	short := func(l string) string { return filepath.Join(filepath.Dir(l), filepath.Base(l)[:oldNameLen]) }
	// a: fully old. b: directory renamed, records not yet. c: old record
	// only beside the new ones (crash after writing the new record).
	a, b, c := imgs[0].Layers[0], imgs[1].Layers[0], imgs[2].Layers[0]
	must(t, os.Rename(a, short(a)), os.Rename(a+".diffid", short(a)+".diffid"))
	must(t, os.Rename(b+".diffid", short(b)+".diffid"))
	rec, _ := os.ReadFile(c + ".diffid")
	must(t, os.WriteFile(short(c)+".diffid", rec, 0o600))
	// A never-completed old layer: a directory without a record.
	orphan := filepath.Join(s.layersDir(), "0123456789ab")
	must(t, os.Mkdir(orphan, 0o755))

	s2, err := Open(ctx, s.root, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range imgs {
		got, err := s2.Get(ctx, want.Name)
		if err != nil {
			t.Fatal(err)
		}
		l := got.Layers[0]
		if l != want.Layers[0] {
			t.Errorf("image %d: layer %s, want %s", i, l, want.Layers[0])
		}
		f := strings.TrimPrefix(strings.TrimSuffix(want.Name, ":1"), "index.docker.io/")
		if _, err := os.Stat(filepath.Join(l, filepath.Base(f))); err != nil {
			t.Errorf("image %d: %v", i, err)
		}
		if id := mustDiffID(t, l); "sha256:"+filepath.Base(l) != id {
			t.Errorf("image %d: record %s", i, id)
		}
	}
	ents, _ := os.ReadDir(s2.layersDir())
	for _, e := range ents {
		if n := strings.TrimSuffix(e.Name(), ".diffid"); len(n) != 64 {
			t.Errorf("left in the layers dir: %s", e.Name())
		}
	}
	if len(ents) != 6 {
		t.Errorf("layers dir has %d entries, want 6", len(ents))
	}
	if ents, _ := os.ReadDir(s2.tmpDir()); len(ents) != 0 {
		t.Errorf("tmp holds %d entries", len(ents))
	}

	// A sandbox mounted before the migration names its lower by the old
	// path: that layer survives its image's removal.
	s2.SetInUse(func() map[string]bool { return map[string]bool{short(a): true} })
	if err := s2.Remove(ctx, imgs[0].Name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a); err != nil {
		t.Errorf("layer in use under its old name was deleted: %v", err)
	}
	s2.SetInUse(nil)
	if err := s2.Remove(ctx, imgs[1].Name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a); !os.IsNotExist(err) {
		t.Errorf("layer no longer in use kept: %v", err)
	}
}

func must(t *testing.T, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestLayersUnreachableByHostUsers: a setuid file stays setuid inside its
// layer, but no host user but root can reach it.
func TestLayersUnreachableByHostUsers(t *testing.T) {
	s, _ := newStore(t)
	layer := tarOf(t, &tar.Header{Typeflag: tar.TypeReg, Name: "su", Linkname: "#!/bin/sh\n", Mode: 0o4755})
	img, err := s.Import(context.Background(), ociBuild{layers: [][]byte{layer}}.write(t, "example.com/suid:1"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	su := filepath.Join(img.Layers[0], "su")
	if fi, err := os.Stat(su); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("su: %v, %v; want setuid kept in the layer", fi, err)
	}
	// Only the store's own modes may stand in the way: open up the test's
	// temporary directories above it.
	for d := filepath.Dir(s.root); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}
	cmd := exec.Command("/bin/cat", su)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("nobody read %s: %v, %q; want permission denied", su, err, out)
	}
}
