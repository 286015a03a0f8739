package image

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/testimage"
)

// needRoot skips (or fails in CI) when not root: unpacking chowns and mknods.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
}

// countHandler counts "layer unpacked" records per layer.
type countHandler struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *countHandler) WithGroup(string) slog.Handler            { return h }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "layer unpacked" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "layer" {
			h.mu.Lock()
			h.n[a.Value.String()]++
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func newStore(t *testing.T) (*Store, *countHandler) {
	t.Helper()
	needRoot(t)
	h := &countHandler{n: map[string]int{}}
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "images"), slog.New(h))
	if err != nil {
		t.Fatal(err)
	}
	return s, h
}

// mustDiffID reads the diff ID recorded for the layer dir l.
func mustDiffID(t *testing.T, l string) string {
	t.Helper()
	b, err := os.ReadFile(l + ".diffid")
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := strings.Cut(string(b), " ")
	return id
}

func TestPullFromRegistry(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	ref := testimage.PushT(t, testimage.BusyboxT(t), "tools/busybox:1")
	var phases []string
	img, err := s.Pull(ctx, ref, true, func(p Progress) {
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
		if p.Total > 0 && p.Done > p.Total {
			t.Errorf("progress Done %d > Total %d", p.Done, p.Total)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"resolve", "download+unpack", "done"}; !slices.Equal(phases, want) {
		t.Errorf("phases = %v, want %v", phases, want)
	}
	if img.Name != ref || !strings.HasPrefix(img.Digest, "sha256:") || len(img.Layers) != 1 || img.Size < 1<<20 {
		t.Errorf("image = %+v", img)
	}
	if !slices.Equal(img.Config.Cmd, []string{"/bin/sh"}) || len(img.Config.Env) != 1 {
		t.Errorf("config = %+v", img.Config)
	}
	l := img.Layers[0]
	if fi, err := os.Stat(filepath.Join(l, "bin/busybox")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/busybox: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(l, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q, %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(l, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp mode: %v %v", fi.Mode(), err)
	}
	if got, want := filepath.Base(l), strings.TrimPrefix(mustDiffID(t, l), "sha256:"); got != want {
		t.Errorf("layer dir %q: want the full diff ID %s", l, want)
	}
	for _, key := range []string{ref, img.Digest, img.Digest[:7+12]} {
		got, err := s.Get(ctx, key)
		if err != nil || got.Digest != img.Digest {
			t.Errorf("Get(%q) = %v, %v", key, got.Digest, err)
		}
	}
	// Re-open: the index persists.
	s2, err := Open(ctx, s.root, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := s2.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != ref || !slices.Equal(list[0].Layers, img.Layers) {
		t.Errorf("List after reopen = %+v, %v", list, err)
	}
	// Pulling again unpacks nothing and keeps the digest.
	again, err := s.Pull(ctx, ref, true, nil)
	if err != nil || again.Digest != img.Digest {
		t.Errorf("second pull = %v, %v", again.Digest, err)
	}
}

func TestImportArchives(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	base := testimage.BusyboxT(t)
	img := testimage.WithFilesT(t, base, map[string]string{"etc/motd": "hi\n"})
	dir := t.TempDir()
	for _, tc := range []struct {
		kind, ref, name, want string
	}{
		{"oci", "example.com/a/oci:1", "", "example.com/a/oci:1"},
		{"docker", "example.com/a/docker:2", "", "example.com/a/docker:2"},
		{"oci", "x.io/named:1", "mine", "index.docker.io/library/mine:latest"},
		{"docker", "x.io/named:2", "other/thing:3", "index.docker.io/other/thing:3"},
	} {
		path := filepath.Join(dir, tc.kind+"-"+strings.NewReplacer("/", "_", ":", "_").Replace(tc.ref)+".tar")
		var err error
		if tc.kind == "oci" {
			err = testimage.WriteOCIArchive(img, tc.ref, path)
		} else {
			err = testimage.WriteDockerArchive(img, tc.ref, path)
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Import(ctx, path, tc.name, nil)
		if err != nil {
			t.Fatalf("import %s %s: %v", tc.kind, tc.ref, err)
		}
		if got.Name != tc.want || len(got.Layers) != 2 {
			t.Errorf("import %s: name %q layers %d, want %q, 2", tc.kind, got.Name, len(got.Layers), tc.want)
		}
		if b, err := os.ReadFile(filepath.Join(got.Layers[1], "etc/motd")); err != nil || string(b) != "hi\n" {
			t.Errorf("import %s: etc/motd = %q, %v", tc.kind, b, err)
		}
		if got.Config.Cmd[0] != "/bin/sh" {
			t.Errorf("import %s: cmd %v", tc.kind, got.Config.Cmd)
		}
	}
	if got, err := s.Get(ctx, "mine"); err != nil || got.Name != "index.docker.io/library/mine:latest" {
		t.Errorf("Get(mine) = %q, %v", got.Name, err)
	}
	list, _ := s.List(ctx)
	if len(list) != 4 {
		t.Errorf("List: %d images, want 4", len(list))
	}
	ents, _ := os.ReadDir(s.layersDir())
	if len(ents) != 4 { // 2 layer dirs + 2 .diffid files
		t.Errorf("layers dir has %d entries, want 4 (2 layers shared by all)", len(ents))
	}
}

func TestSharedLayerUnpackedOnce(t *testing.T) {
	s, h := newStore(t)
	ctx := context.Background()
	base := testimage.BusyboxT(t)
	host := testimage.ServeRegistry(t)
	var refs []string
	for i, c := range []string{"a", "b", "c"} {
		ref := host + "/img/" + c + ":latest"
		img := testimage.WithFilesT(t, base, map[string]string{"id": c})
		if err := testimage.Push(img, ref); err != nil {
			t.Fatal(i, err)
		}
		refs = append(refs, ref)
	}
	var wg sync.WaitGroup
	imgs := make([]Image, len(refs))
	errs := make([]error, len(refs))
	for i, ref := range refs {
		wg.Go(func() { imgs[i], errs[i] = s.Pull(ctx, ref, false, nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatal(refs[i], err)
		}
	}
	if imgs[0].Layers[0] != imgs[1].Layers[0] || imgs[1].Layers[0] != imgs[2].Layers[0] {
		t.Errorf("base layers differ: %v", imgs)
	}
	for l, n := range h.n {
		if n != 1 {
			t.Errorf("layer %s unpacked %d times, want 1", l, n)
		}
	}
	if len(h.n) != 4 {
		t.Errorf("%d layers unpacked, want 4", len(h.n))
	}

	// Remove keeps shared layers and deletes the unreferenced one.
	if err := s.Remove(ctx, refs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(imgs[0].Layers[1]); !os.IsNotExist(err) {
		t.Errorf("top layer of removed image still there: %v", err)
	}
	if _, err := os.Stat(imgs[0].Layers[0]); err != nil {
		t.Errorf("shared base layer gone: %v", err)
	}
	if _, err := s.Get(ctx, refs[0]); !errdefs.IsNotFound(err) {
		t.Errorf("Get removed image: %v, want NotFound", err)
	}
	// A layer in use outside the store survives its image's removal.
	s.SetInUse(func() map[string]bool { return map[string]bool{imgs[1].Layers[1]: true} })
	if err := s.Remove(ctx, imgs[1].Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(imgs[1].Layers[1]); err != nil {
		t.Errorf("in-use layer deleted: %v", err)
	}
	s.SetInUse(nil)
	if err := s.Remove(ctx, refs[2]); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{s.layersDir(), s.tmpDir()} {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s not empty after removing all images: %d entries", d, len(ents))
		}
	}
}

// A Remove cut short by a crash after the index was saved leaves layers no
// image names, which no later Remove collects: Collect, after a restart,
// deletes them, and keeps the layers still in use outside the store. Open
// removes the index's temporary copies a crash left.
func TestCollectAfterCutRemove(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	host := testimage.ServeRegistry(t)
	ref := host + "/img/cut:latest"
	if err := testimage.Push(testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{"id": "cut"}), ref); err != nil {
		t.Fatal(err)
	}
	img, err := s.Pull(ctx, ref, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The crash: the index saved without the image, its layers not yet
	// collected; and a temporary copy of the index left by another.
	if err := os.WriteFile(s.indexPath(), []byte("[]"), 0o600); err != nil {
		t.Fatal(err)
	}
	leftTmp := filepath.Join(s.root, ".index.json.tmp-123")
	if err := os.WriteFile(leftTmp, []byte("[]"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, s.root, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range img.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Fatalf("layer %s gone before Collect: %v", l, err)
		}
	}
	if _, err := os.Stat(leftTmp); !os.IsNotExist(err) {
		t.Errorf("the index's leftover temporary copy after Open: %v", err)
	}
	s2.SetInUse(func() map[string]bool { return map[string]bool{img.Layers[0]: true} })
	s2.Collect(ctx)
	if _, err := os.Stat(img.Layers[0]); err != nil {
		t.Errorf("a layer in use was collected: %v", err)
	}
	if _, err := os.Stat(img.Layers[1]); !os.IsNotExist(err) {
		t.Errorf("the layer no one uses is still there: %v", err)
	}
}
