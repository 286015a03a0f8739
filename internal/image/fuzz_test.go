package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// FuzzUnpack feeds arbitrary bytes to the unpacker as a layer's tar stream.
// Whatever they are, the unpack ends in success, InvalidArgument or
// ResourceExhausted (no panic, no other class), nothing outside the layer
// directory changes (a canary beside it, its parent that stands for the
// store's tmp/), and the layer holds no device node but whiteouts and no
// xattr the host kernel would obey. Its seed corpus (testdata/fuzz) is the
// hostile-layer battery: FORKBOX_WRITE_FUZZ_CORPUS=1 go test -run
// TestWriteFuzzCorpus ./internal/image rewrites it.
func FuzzUnpack(f *testing.F) {
	needRoot(f)
	lim := layerLimits{bytes: 1 << 20, entries: 256, path: 4096}
	// One tree per worker process; each input gets a fresh layer dir in it.
	parent, layer, _ := sandboxDirs(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.RemoveAll(layer); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(layer, 0o755); err != nil {
			t.Fatal(err)
		}
		before := treeState(t, parent, layer)
		err := unpackTar(context.Background(), bytes.NewReader(data), layer, lim)
		if err != nil && !errdefs.IsInvalidArgument(err) && !errdefs.IsResourceExhausted(err) {
			t.Errorf("error of class %v: %v", errdefs.Class(err), err)
		}
		diffStates(t, before, treeState(t, parent, layer))
		checkLayerInvariants(t, layer)
	})
}

// FuzzCleanName checks the entry-name cleaner: a name it accepts is the
// root or a local path without "..", within the length limit, with no
// whiteout but AUFS metadata above its last component.
func FuzzCleanName(f *testing.F) {
	for _, n := range []string{"/", "./", "a/b", "/etc/x", "../x", "a/../b", ".wh...", "a/.wh.b/c", ".wh..wh..opq/x", ".wh..wh.plnk/1", "a//b/./c/", "\x00"} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n string) {
		rel, err := cleanName(n, 256)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("cleanName(%q): error of class %v", n, errdefs.Class(err))
			}
			return
		}
		if rel != "." && !filepath.IsLocal(rel) {
			t.Fatalf("cleanName(%q) = %q: not local", n, rel)
		}
		parts := strings.Split(rel, "/")
		for i, p := range parts {
			if p == ".." || p == "" || (p == "." && rel != ".") || len(p) > nameMax {
				t.Fatalf("cleanName(%q) = %q: component %q", n, rel, p)
			}
			if i < len(parts)-1 && strings.HasPrefix(p, whiteoutPrefix) && !isMeta(p) {
				t.Fatalf("cleanName(%q) = %q: whiteout %q with children", n, rel, p)
			}
		}
		if rel != "." && len(rel) > len(n) {
			t.Fatalf("cleanName(%q) = %q: longer than the name", n, rel)
		}
	})
}

// TestWriteFuzzCorpus writes the hostile-layer battery as FuzzUnpack's seed
// corpus (with the canary as a relative path, as fuzzing cannot know the
// absolute one), but for the cases too big to mutate usefully.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("FORKBOX_WRITE_FUZZ_CORPUS") != "1" {
		t.Skip("set FORKBOX_WRITE_FUZZ_CORPUS=1 to rewrite testdata/fuzz/FuzzUnpack")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzUnpack")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range hostileCases() {
		data := tc.raw
		if data == nil {
			data = tarOf(t, resolve(tc.hdrs, "../canary")...)
		}
		if len(data) > 32<<10 {
			continue // the byte-limit cases: too big to mutate usefully
		}
		name := fmt.Sprintf("seed-%x", sha256.Sum256([]byte(tc.name)))[:21]
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
