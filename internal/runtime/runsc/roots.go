// State roots: every sandbox has a runsc state root of its own,
// Root/<sandbox id>, instead of one root that every sandbox shares.
//
// runsc finds a container by globbing its root ("*_sandbox:<id>*.state",
// and "<id>*_sandbox:*" for a sandbox's containers), and it does so several
// times per call. In a shared root each call read a directory with three
// entries per live sandbox: a `perf record` of creates at 700 live gVisor
// sandboxes put about 15 ms of each create in those globs, and the cost
// grew with the count.
//
// A container started inside a pre-booted sandbox (a tenant, see pod.go)
// must be in the root of that sandbox's first container, where runsc looks
// for the sandbox: its entry is a symlink to the pod's root. A daemon
// before per-sandbox roots kept every container in Root itself; calls for
// an id with no entry of its own still look there, so those containers
// keep working until they are deleted.

package runsc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// RootOf returns the state root of container id: Root/<id> (a directory,
// or a tenant's symlink to its pod's), or Root itself for a container made
// before per-sandbox roots.
func (r *Runsc) RootOf(id string) string {
	if id == "" || validID(id) != nil {
		return r.opts.Root
	}
	p := filepath.Join(r.opts.Root, id)
	if _, err := os.Lstat(p); err == nil {
		return p
	}
	return r.opts.Root
}

// makeRoot gives container id, about to be created from bundle, its state
// root and returns it: a directory of its own, or for a tenant of a
// pre-booted sandbox a symlink to the pod's root (the flat Root when the
// pod was made before per-sandbox roots). A leftover entry of a container
// that a crash cut short is replaced.
func (r *Runsc) makeRoot(id, bundle string) (string, error) {
	s, err := spec.ReadBundle(bundle)
	if err != nil {
		return "", err
	}
	p := filepath.Join(r.opts.Root, id)
	rootErr := func(err error) (string, error) {
		return "", fmt.Errorf("runsc %s: state root: %v: %w", id, err, errdefs.ErrInternal)
	}
	pod := PodOf(s)
	if pod == "" || pod == id {
		// A leftover symlink goes (RemoveAll takes the link, not its
		// target), and so does a leftover directory without state.
		if fi, err := os.Lstat(p); err == nil && (fi.Mode()&fs.ModeSymlink != 0 || !holdsState(p)) {
			if err := os.RemoveAll(p); err != nil {
				return rootErr(err)
			}
		}
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return rootErr(err)
		}
		return p, nil
	}
	if err := validID(pod); err != nil {
		return "", err
	}
	if fi, err := os.Lstat(filepath.Join(r.opts.Root, pod)); err != nil || !fi.IsDir() {
		return r.opts.Root, nil // a pod in the flat root
	}
	if err := os.RemoveAll(p); err != nil {
		return rootErr(err)
	}
	if err := os.Symlink(pod, p); err != nil {
		return rootErr(err)
	}
	return p, nil
}

// State implements runtime.Runtime. A container with no state root of its
// own and no state file in the flat root is unknown to runsc: NotFound
// without a runsc start (about 12 ms, and a read of the whole flat root),
// which every create asks first.
func (r *Runsc) State(ctx context.Context, id string) (runtime.State, error) {
	if validID(id) == nil && r.RootOf(id) == r.opts.Root && !r.inFlatRoot(id) {
		return runtime.State{}, fmt.Errorf("runsc state %s: container does not exist: %w", id, errdefs.ErrNotFound)
	}
	return r.Tool.State(ctx, id)
}

// inFlatRoot reports whether the flat root holds a state file of container
// id (of any sandbox), or cannot be read.
func (r *Runsc) inFlatRoot(id string) bool {
	m, err := filepath.Glob(filepath.Join(r.opts.Root, "*_sandbox:"+id+".state"))
	return err != nil || len(m) > 0
}

// forgetRoot removes the state root entry of container id, which runsc has
// just deleted or never knew: a tenant's symlink, and the directory it
// points to or id's own once no container's state is left in it (what is
// left is the sandbox's control socket and lock files). For a container of
// the flat root it removes what a cut-short `runsc run` or `restore` (its
// CLI killed with a crashed daemon) leaves there: runsc's delete removes
// the control socket and the lock file only with the state file.
func (r *Runsc) forgetRoot(id string) {
	p := filepath.Join(r.opts.Root, id)
	fi, err := os.Lstat(p)
	if err != nil {
		// Our sandboxes in the flat root are their own single container,
		// so the id is both the container's and the sandbox's.
		for _, name := range []string{"runsc-" + id + ".sock", id + "_sandbox:" + id + ".lock"} {
			r.removeLeftover(id, filepath.Join(r.opts.Root, name), os.Remove)
		}
		return
	}
	dir := p
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(p)
		r.removeLeftover(id, p, os.Remove)
		if err != nil || validID(target) != nil {
			return
		}
		dir = filepath.Join(r.opts.Root, target)
	}
	if !holdsState(dir) {
		r.removeLeftover(id, dir, os.RemoveAll)
	}
}

func (r *Runsc) removeLeftover(id, path string, remove func(string) error) {
	if err := remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.log.Warn("remove runsc leftover", "sandbox", id, "path", path, "err", err)
	}
}

// holdsState reports whether dir holds a container's state file (or cannot
// be read: then it is kept).
func holdsState(dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".state") {
			return true
		}
	}
	return false
}

// List implements runtime.Runtime: `runsc list` in the flat root and in
// every sandbox's root that holds a container (a tenant is listed from its
// pod's), a few at a time.
func (r *Runsc) List(ctx context.Context) ([]runtime.State, error) {
	roots := []string{r.opts.Root}
	ents, err := os.ReadDir(r.opts.Root)
	if err != nil {
		return nil, fmt.Errorf("runsc list: %v: %w", err, errdefs.ErrInternal)
	}
	for _, e := range ents {
		if dir := filepath.Join(r.opts.Root, e.Name()); e.IsDir() && holdsState(dir) {
			roots = append(roots, dir)
		}
	}
	var (
		mu  sync.Mutex
		all []runtime.State
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(goruntime.NumCPU())
	for _, root := range roots {
		g.Go(func() error {
			t := ocicli.Tool{Runtime: "runsc", Command: func(ctx context.Context, _ string, args ...string) ([]byte, error) {
				return r.runIn(ctx, root, "", args...)
			}}
			l, err := t.List(gctx)
			mu.Lock()
			all = append(all, l...)
			mu.Unlock()
			return err
		})
	}
	return all, g.Wait()
}
