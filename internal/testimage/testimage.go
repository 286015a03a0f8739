// Package testimage builds real OCI images offline for tests, from Debian's
// busybox-static binary (/bin/busybox), and serves them from an in-process
// registry or writes them as oci-archive and docker-archive tarballs.
//
// Images are deterministic (fixed mtimes, sorted entries), so building the
// same image twice gives the same digests and layers are shared.
package testimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BusyboxPath is the static busybox binary images are built from.
const BusyboxPath = "/bin/busybox"

// Special values for WithFiles.
const (
	// Whiteout as a file's value deletes that path from the lower layers.
	Whiteout = "\x00whiteout"
	// Opaque as a directory's value (key ending in "/") makes the directory
	// opaque: nothing of the lower layers' directory shows through.
	Opaque = "\x00opaque"
)

// epoch is the mtime of every entry, for reproducible digests.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Available reports why busybox images cannot be built here, or nil.
func Available() error {
	if _, err := os.Stat(BusyboxPath); err != nil {
		return fmt.Errorf("%s missing (apt-get install busybox-static): %w", BusyboxPath, err)
	}
	return nil
}

// Busybox returns a one-layer image: /bin/busybox with a symlink in /bin for
// every applet, /etc/passwd and /etc/group with root, /tmp (1777), /root,
// /proc, /sys and /dev; Env PATH, Cmd ["/bin/sh"].
func Busybox() (v1.Image, error) {
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("read busybox: %w", err)
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	var b tarBuilder
	for _, d := range []struct {
		name string
		mode int64
	}{{"bin", 0o755}, {"dev", 0o755}, {"etc", 0o755}, {"proc", 0o555}, {"root", 0o700}, {"sys", 0o555}, {"tmp", 0o1777}} {
		b.dir(d.name, d.mode)
	}
	b.file("bin/busybox", bin, 0o755)
	applets := strings.Fields(string(out))
	sort.Strings(applets)
	for _, a := range applets {
		if a != "busybox" && !strings.Contains(a, "/") {
			b.symlink("bin/"+a, "busybox")
		}
	}
	b.file("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"), 0o644)
	b.file("etc/group", []byte("root:x:0:\nnogroup:x:65534:\n"), 0o644)
	layer, err := b.layer()
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Cmd = []string{"/bin/sh"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.MediaType(mutate.ConfigMediaType(img, types.OCIConfigJSON), types.OCIManifestSchema1), nil
}

// WithFiles returns base plus one layer holding files: path → content
// (mode 0644, root-owned). A key ending in "/" is a directory (value "" or
// Opaque); the value Whiteout deletes the path. Parent directories are
// added as needed.
func WithFiles(base v1.Image, files map[string]string) (v1.Image, error) {
	var b tarBuilder
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	seen := map[string]bool{}
	var parents func(p string)
	parents = func(p string) {
		d := path.Dir(p)
		if d == "." || d == "/" || seen[d] {
			return
		}
		parents(d)
		seen[d] = true
		b.dir(d, 0o755)
	}
	for _, n := range names {
		v := files[n]
		p := strings.Trim(path.Clean("/"+n), "/")
		parents(p)
		switch {
		case strings.HasSuffix(n, "/"):
			if !seen[p] {
				seen[p] = true
				b.dir(p, 0o755)
			}
			if v == Opaque {
				b.file(p+"/.wh..wh..opq", nil, 0o644)
			}
		case v == Whiteout:
			b.file(path.Join(path.Dir(p), ".wh."+path.Base(p)), nil, 0o644)
		default:
			b.file(p, []byte(v), 0o644)
		}
	}
	layer, err := b.layer()
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(base, layer)
}

// tarBuilder writes a deterministic layer tar in memory.
type tarBuilder struct {
	buf bytes.Buffer
	tw  *tar.Writer
	err error
}

func (b *tarBuilder) add(h *tar.Header, data []byte) {
	if b.tw == nil {
		b.tw = tar.NewWriter(&b.buf)
	}
	if b.err != nil {
		return
	}
	h.ModTime, h.Format = epoch, tar.FormatPAX
	if b.err = b.tw.WriteHeader(h); b.err == nil && len(data) > 0 {
		_, b.err = b.tw.Write(data)
	}
}

func (b *tarBuilder) dir(n string, mode int64) {
	b.add(&tar.Header{Typeflag: tar.TypeDir, Name: n + "/", Mode: mode}, nil)
}

func (b *tarBuilder) file(n string, data []byte, mode int64) {
	b.add(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode, Size: int64(len(data))}, data)
}

func (b *tarBuilder) symlink(n, target string) {
	b.add(&tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: target, Mode: 0o777}, nil)
}

func (b *tarBuilder) layer() (v1.Layer, error) {
	if b.tw == nil {
		b.tw = tar.NewWriter(&b.buf)
	}
	if b.err != nil {
		return nil, b.err
	}
	if err := b.tw.Close(); err != nil {
		return nil, err
	}
	data := b.buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
