package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/testimage"
)

// ociBuild is an image written by hand as an oci-archive, so that a test can
// make any part of it lie.
type ociBuild struct {
	layers      [][]byte // uncompressed layer tars, base first
	gzip        bool
	diffIDs     []string          // the config's; nil: the true ones
	annotations map[string]string // on the manifest (to make it big)
	env         []string          // in the config (to make it big)
	// edit may change the files of the layout before they are tarred;
	// keys are "index.json", "manifest", "config", "layer0", ... and the
	// blobs' paths.
	edit func(files map[string][]byte, names map[string]string)
}

func digestOf(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }

func gz(t testing.TB, b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

type desc struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// write writes the archive, naming its image ref, and returns its path.
func (o ociBuild) write(t testing.TB, ref string) string {
	t.Helper()
	files := map[string][]byte{}
	names := map[string]string{} // logical name → path in the layout
	blob := func(logical string, b []byte) desc {
		d := digestOf(b)
		p := "blobs/sha256/" + strings.TrimPrefix(d, "sha256:")
		files[p], names[logical] = b, p
		return desc{Digest: d, Size: len(b)}
	}
	var ls []desc
	diffIDs := o.diffIDs
	for i, l := range o.layers {
		if o.diffIDs == nil {
			diffIDs = append(diffIDs, digestOf(l))
		}
		b, mt := l, "application/vnd.oci.image.layer.v1.tar"
		if o.gzip {
			b, mt = gz(t, l), mt+"+gzip"
		}
		d := blob(fmt.Sprintf("layer%d", i), b)
		d.MediaType = mt
		ls = append(ls, d)
	}
	cfg, _ := json.Marshal(map[string]any{
		"architecture": platform.Architecture, "os": "linux",
		"config": map[string]any{"Env": o.env, "Cmd": []string{"/bin/sh"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	cd := blob("config", cfg)
	cd.MediaType = "application/vnd.oci.image.config.v1+json"
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": cd, "layers": ls, "annotations": o.annotations,
	})
	md := blob("manifest", man)
	md.MediaType = "application/vnd.oci.image.manifest.v1+json"
	md.Annotations = map[string]string{annotationContainerdName: ref}
	idx, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []desc{md}})
	files["index.json"], names["index.json"] = idx, "index.json"
	files["oci-layout"] = []byte(`{"imageLayoutVersion":"1.0.0"}`)
	if o.edit != nil {
		o.edit(files, names)
	}
	path := filepath.Join(t.TempDir(), "img.tar")
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, p := range []string{"oci-layout", "index.json"} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: 0o644, Size: int64(len(files[p]))})
		tw.Write(files[p])
	}
	for p, c := range files {
		if strings.HasPrefix(p, "blobs/") {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: 0o644, Size: int64(len(c))})
			tw.Write(c)
		}
	}
	tw.Close()
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// newLimitedStore opens a store with limits, beside a canary directory.
func newLimitedStore(t *testing.T, lim Limits) (s *Store, parent string) {
	t.Helper()
	needRoot(t)
	parent = t.TempDir()
	if err := os.MkdirAll(filepath.Join(parent, "canary", "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(parent, "canary", "f"), []byte("canary"), 0o644)
	s, err := Open(context.Background(), filepath.Join(parent, "images"), slog.New(slog.DiscardHandler), WithLimits(lim))
	if err != nil {
		t.Fatal(err)
	}
	return s, parent
}

// layerTar is a one-file layer.
func layerTar(t testing.TB, name string, size int) []byte {
	return tarOf(t, &tar.Header{Typeflag: tar.TypeReg, Name: name, Linkname: strings.Repeat("z", size)})
}

func TestHostileImages(t *testing.T) {
	small := Limits{LayerBytes: 4 << 20, ImageBytes: 6 << 20, Layers: 3, ManifestBytes: 64 << 10, ConfigBytes: 64 << 10, LayerEntries: 100}
	good := layerTar(t, "ok", 10)
	other := layerTar(t, "other", 10)
	for _, tc := range []struct {
		name string
		img  ociBuild
		want func(error) bool // nil: imported
	}{
		{"benign", ociBuild{layers: [][]byte{good}, gzip: true}, nil},
		{"wh... in a layer", ociBuild{layers: [][]byte{good, tarOf(t, reg(".wh...", ""))}}, invalid},
		{"gzip bomb", ociBuild{layers: [][]byte{layerTar(t, "bomb", 64<<20)}, gzip: true}, overLimit},
		{"bomb after the tar's end", ociBuild{layers: [][]byte{append(append([]byte{}, good...), make([]byte, 16<<20)...)}, gzip: true}, overLimit},
		{"layers over the image limit", ociBuild{layers: [][]byte{layerTar(t, "a", 3<<20), layerTar(t, "b", 3<<20)}, gzip: true}, overLimit},
		{"too many layers", ociBuild{layers: [][]byte{good, other, layerTar(t, "c", 1), layerTar(t, "d", 1)}}, overLimit},
		{"too many entries", ociBuild{layers: [][]byte{tarOf(t, func() []*tar.Header {
			var h []*tar.Header
			for i := range 101 {
				h = append(h, reg(fmt.Sprint(i), ""))
			}
			return h
		}()...)}}, overLimit},
		{"huge manifest", ociBuild{layers: [][]byte{good}, annotations: map[string]string{"pad": strings.Repeat("x", 100<<10)}}, overLimit},
		{"huge config", ociBuild{layers: [][]byte{good}, env: []string{"PAD=" + strings.Repeat("x", 100<<10)}}, overLimit},
		{"huge index.json", ociBuild{layers: [][]byte{good}, edit: func(f map[string][]byte, _ map[string]string) {
			f["index.json"] = append(f["index.json"][:len(f["index.json"])-1], []byte(`,"pad":"`+strings.Repeat("x", 100<<10)+`"}`)...)
		}}, overLimit},
		{"lying diff ID", ociBuild{layers: [][]byte{good}, diffIDs: []string{digestOf(other)}}, invalid},
		{"lying layer blob", ociBuild{layers: [][]byte{good}, gzip: true, edit: func(f map[string][]byte, n map[string]string) {
			f[n["layer0"]] = good // the right diff ID, but not the blob the manifest names
		}}, invalid},
		{"lying config", ociBuild{layers: [][]byte{good}, edit: func(f map[string][]byte, n map[string]string) {
			f[n["config"]] = bytes.Replace(f[n["config"]], []byte("/bin/sh"), []byte("/bin/xx"), 1)
		}}, invalid},
		{"lying manifest", ociBuild{layers: [][]byte{good}, edit: func(f map[string][]byte, n map[string]string) {
			f[n["manifest"]] = bytes.Replace(f[n["manifest"]], []byte(`"schemaVersion":2`), []byte(`"schemaVersion":2 `), 1)
		}}, invalid},
		{"truncated layer", ociBuild{layers: [][]byte{layerTar(t, "f", 4096)}, diffIDs: []string{digestOf(layerTar(t, "f", 4096))}, edit: func(f map[string][]byte, n map[string]string) {
			f[n["layer0"]] = f[n["layer0"]][:1000]
		}}, invalid},
		{"truncated gzip layer", ociBuild{layers: [][]byte{layerTar(t, "f", 4096)}, gzip: true, edit: func(f map[string][]byte, n map[string]string) {
			f[n["layer0"]] = f[n["layer0"]][:len(f[n["layer0"]])/2]
		}}, invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, parent := newLimitedStore(t, small)
			ctx := context.Background()
			before := treeState(t, parent, s.root)
			img, err := s.Import(ctx, tc.img.write(t, "example.com/hostile:1"), "", nil)
			t.Log(err)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("got %v, want success", err)
			case tc.want != nil && !tc.want(err):
				t.Errorf("got %v (class %v), want %s", err, errdefs.Class(err), wantName(tc.want))
			}
			diffStates(t, before, treeState(t, parent, s.root))
			if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
				t.Errorf("tmp holds %d entries after the import, want none", len(ents))
			}
			if tc.want != nil {
				if ents, _ := os.ReadDir(s.layersDir()); len(ents) != 0 {
					t.Errorf("a refused image left %d entries in the layers dir", len(ents))
				}
				if list, _ := s.List(ctx); len(list) != 0 {
					t.Errorf("a refused image was recorded: %v", list)
				}
			} else if len(img.Layers) != len(tc.img.layers) {
				t.Errorf("got %d layers, want %d", len(img.Layers), len(tc.img.layers))
			}
			// The store still works.
			if _, err := s.Import(ctx, ociBuild{layers: [][]byte{other}}.write(t, "example.com/after:1"), "", nil); err != nil {
				t.Errorf("import after: %v", err)
			}
		})
	}
}

// TestPullBoundsDocuments pulls images whose manifest, index or config is
// over the store's limits from a registry.
func TestPullBoundsDocuments(t *testing.T) {
	lim := Limits{ManifestBytes: 64 << 10, ConfigBytes: 64 << 10, Layers: 2}
	s, parent := newLimitedStore(t, lim)
	ctx := context.Background()
	host := testimage.ServeRegistry(t)
	base, err := mutate.AppendLayers(empty.Image, static.NewLayer(layerTar(t, "f", 10), types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	bigManifest := mutate.Annotations(base, map[string]string{"pad": strings.Repeat("x", 100<<10)}).(v1.Image)
	bigConfig, err := mutate.Config(base, v1.Config{Env: []string{"PAD=" + strings.Repeat("x", 100<<10)}})
	if err != nil {
		t.Fatal(err)
	}
	manyLayers, err := mutate.AppendLayers(base,
		static.NewLayer(layerTar(t, "g", 10), types.OCIUncompressedLayer),
		static.NewLayer(layerTar(t, "h", 10), types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	bigIndex := mutate.Annotations(mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: base}),
		map[string]string{"pad": strings.Repeat("x", 100<<10)}).(v1.ImageIndex)
	push := func(ref string, w func(name.Reference) error) string {
		r, err := name.ParseReference(host+"/"+ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := w(r); err != nil {
			t.Fatal(err)
		}
		return r.Name()
	}
	img := func(i v1.Image) func(name.Reference) error {
		return func(r name.Reference) error { return remote.Write(r, i) }
	}
	before := treeState(t, parent, s.root)
	for _, tc := range []struct {
		name, ref string
		want      func(error) bool
	}{
		{"fits", push("ok:1", img(base)), nil},
		{"big manifest", push("bigm:1", img(bigManifest)), overLimit},
		{"big config", push("bigc:1", img(bigConfig)), overLimit},
		{"too many layers", push("many:1", img(manyLayers)), overLimit},
		{"big index", push("bigi:1", func(r name.Reference) error { return remote.WriteIndex(r, bigIndex) }), overLimit},
	} {
		_, err := s.Pull(ctx, tc.ref, true, nil)
		t.Logf("%s: %v", tc.name, err)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: got %v, want success", tc.name, err)
		case tc.want != nil && !tc.want(err):
			t.Errorf("%s: got %v (class %v), want %s", tc.name, err, errdefs.Class(err), wantName(tc.want))
		}
	}
	diffStates(t, before, treeState(t, parent, s.root))
	if list, _ := s.List(ctx); len(list) != 1 {
		t.Errorf("got %d images, want only the one that fits", len(list))
	}
}

// TestImportDockerArchiveBounds imports docker archives whose manifest.json,
// config or layer count is over the store's limits.
func TestImportDockerArchiveBounds(t *testing.T) {
	s, parent := newLimitedStore(t, Limits{ManifestBytes: 64 << 10, ConfigBytes: 64 << 10, Layers: 1})
	layer := layerTar(t, "f", 10)
	cfg := func(n int, pad int) []byte {
		var ids []string
		for range n {
			ids = append(ids, digestOf(layer))
		}
		b, _ := json.Marshal(map[string]any{
			"architecture": platform.Architecture, "os": "linux",
			"config": map[string]any{"Env": []string{"PAD=" + strings.Repeat("x", pad)}},
			"rootfs": map[string]any{"type": "layers", "diff_ids": ids},
		})
		return b
	}
	archive := func(manifest, config []byte, layers int) string {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		add := func(name string, data []byte) {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))})
			tw.Write(data)
		}
		add("config.json", config)
		var ls []string
		for i := range layers {
			ls = append(ls, fmt.Sprintf("l%d.tar", i))
			add(ls[i], layer)
		}
		if manifest == nil {
			manifest, _ = json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{"example.com/d:1"}, "Layers": ls}})
		}
		add("manifest.json", manifest)
		tw.Close()
		p := filepath.Join(t.TempDir(), "d.tar")
		must(t, os.WriteFile(p, b.Bytes(), 0o644))
		return p
	}
	ctx := context.Background()
	before := treeState(t, parent, s.root)
	for _, tc := range []struct {
		name string
		path string
		want func(error) bool
	}{
		{"fits", archive(nil, cfg(1, 10), 1), nil},
		{"big manifest.json", archive([]byte(`[{"Config":"config.json","RepoTags":["`+strings.Repeat("x", 100<<10)+`"]}]`), cfg(1, 10), 1), overLimit},
		{"big config", archive(nil, cfg(1, 100<<10), 1), overLimit},
		{"too many layers", archive(nil, cfg(2, 10), 2), overLimit},
	} {
		_, err := s.Import(ctx, tc.path, "", nil)
		t.Logf("%s: %v", tc.name, err)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: got %v, want success", tc.name, err)
		case tc.want != nil && !tc.want(err):
			t.Errorf("%s: got %v (class %v), want %s", tc.name, err, errdefs.Class(err), wantName(tc.want))
		}
	}
	diffStates(t, before, treeState(t, parent, s.root))
	if list, _ := s.List(ctx); len(list) != 1 {
		t.Errorf("got %d images, want only the one that fits", len(list))
	}
}
