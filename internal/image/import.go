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
	return s.importArchive(ctx, path, name, progress, replace)
}

// ImportKeep is Import that keeps an image the name holds already: the
// import of another image under a taken name is FailedPrecondition and
// replaces nothing; the same image again returns it.
func (s *Store) ImportKeep(ctx context.Context, path, name string, progress func(Progress)) (Image, error) {
	return s.importArchive(ctx, path, name, progress, addNew)
}

func (s *Store) importArchive(ctx context.Context, path, name string, progress func(Progress), mode addMode) (Image, error) {
	if name != "" {
		n, err := normalize(name)
		if err != nil {
			return Image{}, err
		}
		name = n
	}
	report(progress, Progress{Phase: "resolve"})
	entries, err := scanTar(path, s.limits.LayerEntries)
	if err != nil {
		return Image{}, err
	}
	var out Image
	switch {
	case has(entries, "oci-layout") && has(entries, "index.json"):
		if entries["index.json"] > s.limits.ManifestBytes {
			return Image{}, exhausted("archive's index.json", s.limits.ManifestBytes)
		}
		out, err = s.importOCI(ctx, path, name, progress, mode)
	case has(entries, "manifest.json"):
		if entries["manifest.json"] > s.limits.ManifestBytes {
			return Image{}, exhausted("archive's manifest.json", s.limits.ManifestBytes)
		}
		out, err = s.importDocker(ctx, path, name, entries, progress, mode)
	default:
		return Image{}, fmt.Errorf("import %s: neither an OCI layout nor a docker archive: %w", path, errdefs.ErrInvalidArgument)
	}
	if err != nil && !isClassified(err) {
		err = fmt.Errorf("import %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	return out, err
}

func has(m map[string]int64, k string) bool { _, ok := m[k]; return ok }

// scanTar lists the regular files of a tar archive with their sizes; an
// archive of more than max entries is refused.
func scanTar(p string, max int) (map[string]int64, error) {
	f, err := os.Open(p)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("import %s: %w", p, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("import %s: %v: %w", p, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	out := map[string]int64{}
	n := 0
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("import %s: not a valid tar archive: %v: %w", p, err, errdefs.ErrInvalidArgument)
		}
		if n++; n > max {
			return nil, fmt.Errorf("import %s: %w", p, exhausted("archive's number of entries", int64(max)))
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

func (s *Store) importOCI(ctx context.Context, archive, want string, progress func(Progress), mode addMode) (Image, error) {
	dir, err := os.MkdirTemp(s.tmpDir(), "import-")
	if err != nil {
		return Image{}, fmt.Errorf("temp dir: %v: %w", err, errdefs.ErrInternal)
	}
	defer removeAll(dir)
	if err := extractFiles(ctx, archive, dir, s.limits.PathBytes); err != nil {
		return Image{}, err
	}
	if fi, err := os.Stat(filepath.Join(dir, "index.json")); err == nil && fi.Size() > s.limits.ManifestBytes {
		return Image{}, exhausted("archive's index.json", s.limits.ManifestBytes)
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
	// ggcr's layout reader trusts blob names: each document is checked
	// against its descriptor's size (bounded) and digest before it is read.
	var img v1.Image
	if d.MediaType.IsIndex() {
		if err := s.checkBlob(ctx, dir, d, s.limits.ManifestBytes, "nested index"); err != nil {
			return Image{}, err
		}
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return Image{}, fmt.Errorf("read nested index: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		cd, err := pickPlatform(child)
		if err != nil {
			return Image{}, err
		}
		d = cd
		idx = child
	}
	if err := s.checkBlob(ctx, dir, d, s.limits.ManifestBytes, "image manifest"); err != nil {
		return Image{}, err
	}
	if img, err = idx.Image(d.Digest); err != nil {
		return Image{}, fmt.Errorf("read image: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	m, err := img.Manifest()
	if err != nil {
		return Image{}, fmt.Errorf("read image manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := s.checkBlob(ctx, dir, m.Config, s.limits.ConfigBytes, "image config"); err != nil {
		return Image{}, err
	}
	return s.store(ctx, n, img, false, nil, progress, mode)
}

// pickPlatform returns the descriptor of idx's image for this platform.
func pickPlatform(idx v1.ImageIndex) (v1.Descriptor, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("read index: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	for _, d := range im.Manifests {
		if d.MediaType.IsImage() && (d.Platform == nil || d.Platform.Satisfies(platform)) {
			return d, nil
		}
	}
	return v1.Descriptor{}, fmt.Errorf("no image for %s/%s: %w", platform.OS, platform.Architecture, errdefs.ErrNotFound)
}

// checkBlob checks the blob of d in the OCI layout at dir: at most max
// bytes, of d's size and digest.
func (s *Store) checkBlob(ctx context.Context, dir string, d v1.Descriptor, max int64, what string) error {
	if d.Digest.Algorithm != "sha256" || !validDiffID(d.Digest.String()) {
		return fmt.Errorf("%s: unsupported digest %q: %w", what, d.Digest, errdefs.ErrInvalidArgument)
	}
	if d.Size > max {
		return exhausted(what, max)
	}
	f, err := os.Open(filepath.Join(dir, "blobs", "sha256", d.Digest.Hex))
	if err != nil {
		return fmt.Errorf("%s %s: missing from the archive: %w", what, d.Digest, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	b, err := readAllLimited(ctx, f, max, what)
	if err != nil {
		return err
	}
	if err := checkDigest(b, d.Digest, d.Size); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// extractFiles copies the regular files of an archive into dir. Together
// they may not hold more bytes than the archive itself (which only a sparse
// entry could do).
func extractFiles(ctx context.Context, archive, dir string, maxPath int) error {
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("open %s: %v: %w", archive, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %v: %w", archive, err, errdefs.ErrInvalidArgument)
	}
	left := fi.Size()
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
		rel, err := cleanName(hdr.Name, maxPath)
		if err != nil {
			return fmt.Errorf("archive entry %q: %w", hdr.Name, err)
		}
		if rel == "." {
			continue
		}
		if left -= hdr.Size; hdr.Size < 0 || left < 0 {
			return fmt.Errorf("archive entry %q: entries hold more bytes than the archive: %w", hdr.Name, errdefs.ErrInvalidArgument)
		}
		// Only regular files are written here, so no path can lead
		// through a symlink; a file where a directory must go is a
		// malformed archive.
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return fmt.Errorf("archive entry %q: %v: %w", hdr.Name, err, errdefs.ErrInvalidArgument)
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("archive entry %q: %v: %w", hdr.Name, err, errdefs.ErrInvalidArgument)
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

func (s *Store) importDocker(ctx context.Context, archive, want string, entries map[string]int64, progress func(Progress), mode addMode) (Image, error) {
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
	if got := entries[path.Clean(m[pick].Config)]; got > s.limits.ConfigBytes {
		return Image{}, exhausted("image config", s.limits.ConfigBytes)
	}
	if got := len(m[pick].Layers); got > s.limits.Layers {
		return Image{}, exhausted(fmt.Sprintf("image's %d layers", got), int64(s.limits.Layers))
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
	return s.store(ctx, n, img, true, sizes, progress, mode)
}
