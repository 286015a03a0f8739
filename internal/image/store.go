// Package image owns forkbox's OCI image store: it pulls images from
// registries, imports oci-archive and docker-archive tarballs, and unpacks
// every layer exactly once into a directory that is shared read-only by all
// images and sandboxes as an overlayfs lower directory.
//
// On-disk layout under the root directory (0700, as is every directory in
// it: layers hold the images' setuid files and must not be reachable by host
// users other than root; overlayfs reads lowers with the mounter's
// credentials, so sandboxes do not need the path to be traversable):
//
//	index.json        all image records (name → digest, layer diff IDs, config),
//	                  rewritten atomically (temp file + rename)
//	l/<64 hex>        one unpacked layer, named by the full hex of its diff ID
//	                  (sha256 of the uncompressed tar), so no two layers can
//	                  share a directory. Long overlay lowerdir= lists are no
//	                  concern: internal/mount passes lowers one by one when
//	                  they do not fit a page.
//	l/<64 hex>.diffid "<diff ID> <size>", written before the directory is
//	                  renamed into place
//	b/<64 hex>        the manifest, config and compressed layer blobs of
//	                  pulled and OCI-imported images, as read and verified,
//	                  for other nodes to fetch by digest (blobs.go)
//	tmp/              layers being unpacked, blobs and archives being read,
//	                  and tombstones (rm-*) of layers and blobs being
//	                  deleted; emptied by Open
//
// Stores written before layers were named by the full digest used the first
// 12 hex digits (l/<12 hex> and l/<12 hex>.diffid). Open migrates them in
// place (see migrate.go): each is renamed to its full name, so no layer is
// unpacked again and nothing needs the network.
//
// Images are hostile input: every layer entry is confined to its layer
// directory and every document and stream is bounded (Limits); see
// unpack.go for what an unpacked layer keeps of its tar entries.
//
// OCI whiteouts are converted to overlayfs form when a layer is unpacked, so
// the layer directories can be stacked by the kernel directly.
package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/forkbox/forkbox/errdefs"
)

// Progress reports the advance of a pull or import. Phases are "resolve",
// "download+unpack" (Done and Total in bytes of layer blobs; Total is 0 when
// unknown) and "done".
type Progress struct {
	Phase       string
	Done, Total int64
}

// Config is the part of an image's OCI config that a sandbox needs.
type Config struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// Image is a stored image.
type Image struct {
	// Name is the normalised reference ("index.docker.io/library/busybox:latest").
	Name string
	// Digest is the manifest digest ("sha256:...").
	Digest string
	// Size is the total size in bytes of the layers' uncompressed tar streams.
	Size int64
	// Layers are absolute paths of the unpacked layer directories, lowest
	// (base) first. Reverse them for an overlay lowerdir= option.
	Layers []string
	Config Config
	// Created is when the image was stored here.
	Created time.Time
}

// record is an image as kept in index.json.
type record struct {
	Name    string    `json:"name"`
	Digest  string    `json:"digest"`
	Size    int64     `json:"size"`
	DiffIDs []string  `json:"diffIDs"`
	Config  Config    `json:"config"`
	Created time.Time `json:"created"`
	// Blobs are the digests of the config and layer blobs kept in b/
	// (with Digest, the manifest's); empty when the image keeps none.
	Blobs []string `json:"blobs,omitempty"`
}

// Store is an image store rooted at one directory. It is safe for concurrent
// use by one process.
type Store struct {
	root   string
	log    *slog.Logger
	limits Limits

	mu     sync.Mutex        // guards images, pinned and index.json
	images map[string]record // by name
	pinned map[string]int    // diff IDs held by pulls in flight
	inUse  func() map[string]bool

	layerMu    sync.Mutex
	layerLocks map[string]*layerLock // per diff ID
}

type layerLock struct {
	mu   sync.Mutex
	refs int
}

// Open opens (creating if needed) the store at root, migrates an older
// layout, and removes what a crash may have left in root/tmp (even when
// that is not a directory any more) and the blobs no image lists.
func Open(ctx context.Context, root string, log *slog.Logger, opts ...Option) (*Store, error) {
	if log == nil {
		log = slog.Default()
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("image store root %q: %v: %w", root, err, errdefs.ErrInvalidArgument)
	}
	s := &Store{
		root:       root,
		log:        log.With("component", "image"),
		images:     map[string]record{},
		pinned:     map[string]int{},
		layerLocks: map[string]*layerLock{},
		limits:     DefaultLimits,
	}
	for _, o := range opts {
		o(s)
	}
	for _, d := range []string{root, s.layersDir(), s.blobsDir(), s.tmpDir()} {
		if err := ensurePrivateDir(d); err != nil {
			return nil, err
		}
	}
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	left, _ := os.ReadDir(s.tmpDir())
	for _, e := range left {
		p := filepath.Join(s.tmpDir(), e.Name())
		if err := removeAll(p); err != nil {
			s.log.WarnContext(ctx, "remove leftover", "path", p, "err", err)
		}
	}
	// The index's temporary copies a crash left (writeFileAtomic: its
	// rename is the commit point).
	if tmps, err := filepath.Glob(filepath.Join(root, "."+filepath.Base(s.indexPath())+".tmp-*")); err == nil {
		for _, p := range tmps {
			if err := os.Remove(p); err != nil {
				s.log.WarnContext(ctx, "remove leftover", "path", p, "err", err)
			}
		}
	}
	b, err := os.ReadFile(s.indexPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read image index: %v: %w", err, errdefs.ErrInternal)
	default:
		var recs []record
		if err := json.Unmarshal(b, &recs); err != nil {
			return nil, fmt.Errorf("parse %s: %v: %w", s.indexPath(), err, errdefs.ErrInternal)
		}
		for _, r := range recs {
			s.images[r.Name] = r
		}
	}
	// Blobs that a crash left between being kept and their image being
	// recorded (or removed) are listed by no image: delete them. Layers
	// wait for a Remove, which knows what sandboxes still mount.
	s.mu.Lock()
	s.gcBlobsLocked(ctx)
	s.mu.Unlock()
	return s, nil
}

// SetInUse registers a function that returns the layer directories (as in
// Image.Layers) that something outside the store still uses, e.g. as lowers
// of mounted sandboxes. Remove keeps those layers even when no image names
// them; a later Remove collects them.
func (s *Store) SetInUse(f func() map[string]bool) {
	s.mu.Lock()
	s.inUse = f
	s.mu.Unlock()
}

func (s *Store) layersDir() string { return filepath.Join(s.root, "l") }
func (s *Store) tmpDir() string    { return filepath.Join(s.root, "tmp") }
func (s *Store) indexPath() string { return filepath.Join(s.root, "index.json") }

// layerDir is where the layer with diff ID "sha256:<hex>" is unpacked.
func (s *Store) layerDir(diffID string) string {
	return filepath.Join(s.layersDir(), strings.TrimPrefix(diffID, "sha256:"))
}

// ensurePrivateDir makes d a directory of mode 0700, replacing whatever else
// is there (a store damaged by an older version could have a device node in
// place of tmp/, which would otherwise stop every later start).
func ensurePrivateDir(d string) error {
	fi, err := os.Lstat(d)
	if err == nil && !fi.IsDir() {
		if err := os.Remove(d); err != nil {
			return fmt.Errorf("replace %s (a %v, not a directory): %v: %w", d, fi.Mode().Type(), err, errdefs.ErrInternal)
		}
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return fmt.Errorf("create %s: %v: %w", d, err, errdefs.ErrInternal)
	}
	if err := os.Chmod(d, 0o700); err != nil {
		return fmt.Errorf("chmod %s: %v: %w", d, err, errdefs.ErrInternal)
	}
	return nil
}

func (s *Store) toImage(r record) Image {
	img := Image{Name: r.Name, Digest: r.Digest, Size: r.Size, Config: r.Config, Created: r.Created}
	for _, d := range r.DiffIDs {
		img.Layers = append(img.Layers, s.layerDir(d))
	}
	return img
}

// normalize turns a user's reference into the name images are stored under.
func normalize(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	return r.Name(), nil
}

// lookup finds the records matching nameOrDigest; s.mu must be held.
func (s *Store) lookup(nameOrDigest string) ([]record, error) {
	if strings.HasPrefix(nameOrDigest, "sha256:") {
		var out []record
		for _, r := range s.images {
			if r.Digest == nameOrDigest || (len(nameOrDigest) >= 7+12 && strings.HasPrefix(r.Digest, nameOrDigest)) {
				out = append(out, r)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("image %q: %w", nameOrDigest, errdefs.ErrNotFound)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return out, nil
	}
	if r, ok := s.images[nameOrDigest]; ok {
		return []record{r}, nil
	}
	n, err := normalize(nameOrDigest)
	if err != nil {
		return nil, err
	}
	if r, ok := s.images[n]; ok {
		return []record{r}, nil
	}
	return nil, fmt.Errorf("image %q: %w", nameOrDigest, errdefs.ErrNotFound)
}

// Get returns the image with the given name (normalised: "busybox" is
// "index.docker.io/library/busybox:latest") or manifest digest ("sha256:...",
// or a unique prefix of at least 12 hex digits).
func (s *Store) Get(ctx context.Context, nameOrDigest string) (Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, err := s.lookup(nameOrDigest)
	if err != nil {
		return Image{}, err
	}
	return s.toImage(recs[0]), nil
}

// List returns all images, sorted by name.
func (s *Store) List(ctx context.Context) ([]Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Image, 0, len(s.images))
	for _, r := range s.images {
		out = append(out, s.toImage(r))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove removes an image name (or, given a digest, every name of that
// image), then deletes the layers that no image references any more.
func (s *Store) Remove(ctx context.Context, nameOrDigest string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, err := s.lookup(nameOrDigest)
	if err != nil {
		return err
	}
	for _, r := range recs {
		delete(s.images, r.Name)
	}
	if err := s.saveLocked(); err != nil {
		for _, r := range recs {
			s.images[r.Name] = r
		}
		return err
	}
	s.log.InfoContext(ctx, "image removed", "image", nameOrDigest)
	s.gcLocked(ctx)
	return nil
}

// addMode says what add does when the name is taken.
type addMode int

const (
	replace     addMode = iota // the new record replaces the old
	addIfAbsent                // the old record stays, and is returned
	addNew                     // another image under the name is refused; the same one is returned
)

// add records an image under its name; it returns the record the name
// holds afterwards.
func (s *Store) add(r record, mode addMode) (record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.images[r.Name]
	if had && mode == addIfAbsent {
		return old, nil
	}
	if had && mode == addNew {
		if old.Digest == r.Digest {
			return old, nil
		}
		return record{}, fmt.Errorf("image name %s holds another image here (%s, not %s): it is kept; import under another name: %w",
			r.Name, old.Digest, r.Digest, errdefs.ErrFailedPrecondition)
	}
	s.images[r.Name] = r
	if err := s.saveLocked(); err != nil {
		if had {
			s.images[r.Name] = old
		} else {
			delete(s.images, r.Name)
		}
		return record{}, err
	}
	return r, nil
}

func (s *Store) saveLocked() error {
	recs := make([]record, 0, len(s.images))
	for _, r := range s.images {
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Name < recs[j].Name })
	b, err := json.MarshalIndent(recs, "", "  ")
	if err != nil {
		return fmt.Errorf("encode image index: %v: %w", err, errdefs.ErrInternal)
	}
	if err := writeFileAtomic(s.indexPath(), b); err != nil {
		return fmt.Errorf("write image index: %v: %w", err, errdefs.ErrInternal)
	}
	return nil
}

// pin keeps diff IDs from garbage collection while a pull is in flight.
func (s *Store) pin(diffIDs []string) (unpin func()) {
	s.mu.Lock()
	for _, d := range diffIDs {
		s.pinned[d]++
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		for _, d := range diffIDs {
			if s.pinned[d]--; s.pinned[d] <= 0 {
				delete(s.pinned, d)
			}
		}
		s.mu.Unlock()
	}
}

// lockLayer serialises work on one diff ID.
func (s *Store) lockLayer(diffID string) (unlock func()) {
	s.layerMu.Lock()
	l := s.layerLocks[diffID]
	if l == nil {
		l = &layerLock{}
		s.layerLocks[diffID] = l
	}
	l.refs++
	s.layerMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.layerMu.Lock()
		if l.refs--; l.refs == 0 {
			delete(s.layerLocks, diffID)
		}
		s.layerMu.Unlock()
	}
}

func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// removeAll is os.RemoveAll that first makes read-only directories writable
// (layers may contain 0555 dirs; root ignores that, but be safe).
func removeAll(p string) error {
	err := os.RemoveAll(p)
	if err == nil {
		return nil
	}
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}
