package main

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// unpackRootfs writes the flattened filesystem of img into dir: the same
// rootfs the sandboxes get, for the raw floor.
func unpackRootfs(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean("/" + h.Name)
		if strings.Contains(h.Name, "..") {
			return fmt.Errorf("unsafe path %q in image", h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode)&os.ModePerm); err != nil {
				return err
			}
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&os.ModePerm)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.Symlink(h.Linkname, p); err != nil && !os.IsExist(err) {
				return err
			}
		}
	}
}

// floorOnce starts /bin/true of rootfs in fresh mount, pid, uts, ipc and
// net namespaces, chrooted, and waits for it: the least any sandbox start
// can cost on this host (no cgroup, no overlay, no runtime).
func floorOnce(ctx context.Context, rootfs string) (float64, error) {
	t := time.Now()
	cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Dir: "/", Env: []string{"PATH=/bin"},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET,
			Chroot:     rootfs,
		}}
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("raw namespaced start of %s/bin/true: %w", rootfs, err)
	}
	return ms(time.Since(t)), ctx.Err()
}

// measureFloor runs floorOnce n times (after one warm-up).
func measureFloor(ctx context.Context, rootfs string, n int) (Summary, error) {
	if _, err := floorOnce(ctx, rootfs); err != nil {
		return Summary{}, err
	}
	var xs []float64
	for range n {
		d, err := floorOnce(ctx, rootfs)
		if err != nil {
			return Summary{}, err
		}
		xs = append(xs, d)
	}
	return summarize(xs), nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
