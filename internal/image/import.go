package image

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkbox/forkbox/errdefs"
)

// Annotations that name an image inside an OCI layout.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Import stores the image in the archive at path: an oci-archive (a tar of an
// OCI image layout, as written by skopeo, buildah or docker save ≥ 25) or a
// docker-archive (docker save, go-containerregistry's tarball.Write). name ""
// takes the name recorded in the archive; an archive without one is an
// InvalidArgument error, as is a corrupt archive.
func (s *Store) Import(ctx context.Context, path, name string, progress func(Progress)) (Image, error) {
	if name != "" {
		n, err := normalize(name)
		if err != nil {
			return Image{}, err
		}
		name = n
	}
	report(progress, Progress{Phase: "resolve"})
	entries, err := scanTar(path)
	if err != nil {
		return Image{}, err
	}
	var out Image
	switch {
	case has(entries, "oci-layout") && has(entries, "index.json"):
		out, err = s.importOCI(ctx, path, name, progress)
	case has(entries, "manifest.json"):
		out, err = s.importDocker(ctx, path, name, entries, progress)
	default:
		return Image{}, fmt.Errorf("import %s: neither an OCI layout nor a docker archive: %w", path, errdefs.ErrInvalidArgument)
	}
	if err != nil && !isClassified(err) {
		err = fmt.Errorf("import %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	return out, err
}

func has(m map[string]int64, k string) bool { _, ok := m[k]; return ok }

// scanTar lists the regular files of a tar archive with their sizes.
func scanTar(p string) (map[string]int64, error) {
	f, err := os.Open(p)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("import %s: %w", p, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("import %s: %v: %w", p, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	out := map[string]int64{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("import %s: not a valid tar archive: %v: %w", p, err, errdefs.ErrInvalidArgument)
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA {
			out[path.Clean(hdr.Name)] = hdr.Size
		}
	}
	return out, nil
}

// archiveName is the image name recorded in an OCI descriptor, or "".
func archiveName(d v1.Descriptor) string {
	if n := d.Annotations[annotationContainerdName]; n != "" {
		return n
	}
	// ref.name is often just a tag ("latest"); only a full reference names
	// an image.
	if n := d.Annotations[annotationRefName]; strings.ContainsAny(n, ":/@") {
		return n
	}
	return ""
}

func (s *Store) importOCI(ctx context.Context, archive, want string, progress func(Progress)) (Image, error) {
	dir, err := os.MkdirTemp(s.tmpDir(), "import-")
	if err != nil {
		return Image{}, fmt.Errorf("temp dir: %v: %w", err, errdefs.ErrInternal)
	}
	defer removeAll(dir)
	if err := extractFiles(ctx, archive, dir); err != nil {
		return Image{}, err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return Image{}, fmt.Errorf("read OCI layout: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return Image{}, fmt.Errorf("read OCI index: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	cands := im.Manifests
	if want != "" {
		var named []v1.Descriptor
		for _, d := range cands {
			if n, err := normalize(archiveName(d)); err == nil && n == want {
				named = append(named, d)
			}
		}
		if len(named) > 0 {
			cands = named
		}
	}
	if len(cands) > 1 {
		var plat []v1.Descriptor
		for _, d := range cands {
			if d.Platform != nil && d.Platform.Satisfies(platform) {
				plat = append(plat, d)
			}
		}
		if len(plat) > 0 {
			cands = plat
		}
	}
	if len(cands) == 0 {
		return Image{}, fmt.Errorf("OCI layout has no image: %w", errdefs.ErrInvalidArgument)
	}
	d := cands[0]
	n := want
	if n == "" {
		if n = archiveName(d); n == "" {
			return Image{}, fmt.Errorf("archive %s names no image and no name was given: %w", archive, errdefs.ErrInvalidArgument)
		}
		if n, err = normalize(n); err != nil {
			return Image{}, err
		}
	}
	var img v1.Image
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return Image{}, fmt.Errorf("read nested index: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		img, err = pickPlatform(child)
		if err != nil {
			return Image{}, err
		}
	} else if img, err = idx.Image(d.Digest); err != nil {
		return Image{}, fmt.Errorf("read image: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return s.store(ctx, n, img, false, nil, progress)
}

func pickPlatform(idx v1.ImageIndex) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	for _, d := range im.Manifests {
		if d.MediaType.IsImage() && (d.Platform == nil || d.Platform.Satisfies(platform)) {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no image for %s/%s: %w", platform.OS, platform.Architecture, errdefs.ErrNotFound)
}

// extractFiles copies the regular files of an archive into dir.
func extractFiles(ctx context.Context, archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("open %s: %v: %w", archive, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read archive: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA {
			continue
		}
		rel, err := clean(hdr.Name)
		if err != nil {
			return fmt.Errorf("archive entry %q: %w", hdr.Name, err)
		}
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return fmt.Errorf("mkdir: %v: %w", err, errdefs.ErrInternal)
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("create: %v: %w", err, errdefs.ErrInternal)
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("extract %s: %v: %w", hdr.Name, err, errdefs.ErrInvalidArgument)
		}
	}
}

func (s *Store) importDocker(ctx context.Context, archive, want string, entries map[string]int64, progress func(Progress)) (Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(archive) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return Image{}, fmt.Errorf("read manifest.json: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(m) == 0 {
		return Image{}, fmt.Errorf("docker archive has no image: %w", errdefs.ErrInvalidArgument)
	}
	pick, tagName := -1, ""
	for i, d := range m {
		for _, t := range d.RepoTags {
			if n, err := normalize(t); err == nil && (want == "" || n == want) {
				if pick < 0 {
					pick, tagName = i, t
				}
			}
		}
	}
	switch {
	case len(m) == 1:
		pick = 0
	case pick < 0:
		return Image{}, fmt.Errorf("docker archive holds %d images; name one of them: %w", len(m), errdefs.ErrInvalidArgument)
	}
	n := want
	if n == "" {
		if tagName == "" {
			return Image{}, fmt.Errorf("archive %s names no image and no name was given: %w", archive, errdefs.ErrInvalidArgument)
		}
		if n, err = normalize(tagName); err != nil {
			return Image{}, err
		}
	}
	var tag *name.Tag
	if len(m) > 1 {
		t, err := name.NewTag(tagName)
		if err != nil {
			return Image{}, fmt.Errorf("tag %q: %v: %w", tagName, err, errdefs.ErrInvalidArgument)
		}
		tag = &t
	}
	img, err := tarball.Image(opener, tag)
	if err != nil {
		return Image{}, fmt.Errorf("read docker archive: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	var sizes []int64
	for _, l := range m[pick].Layers {
		sizes = append(sizes, entries[path.Clean(l)])
	}
	return s.store(ctx, n, img, true, sizes, progress)
}
