// Tests against the real crun binary (root only): the shared conformance
// suite, the OOM case, the seccomp profile and the cgroup-mode detection.

package crun

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

func newRuntime(t *testing.T) runtime.Runtime {
	t.Helper()
	testsuite.RequireRoot(t, "crun")
	dir := t.TempDir()
	rt, err := New(Options{Root: filepath.Join(dir, "state"), LogDir: filepath.Join(dir, "logs")})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func TestSuite(t *testing.T) { testsuite.Run(t, newRuntime, testsuite.WithSpec(Adapt)) }

func TestOOMKillInside(t *testing.T) { testsuite.RunOOM(t, newRuntime, testsuite.WithSpec(Adapt)) }

// TestSeccomp checks that Harden's profile is in force in the container:
// the denied syscalls fail and ordinary work goes on.
func TestSeccomp(t *testing.T) {
	rt := newRuntime(t)
	script := `grep Seccomp: /proc/self/status; unshare -n true; echo unshare=$?; ` +
		`mkdir -p /m; mount -t tmpfs t /m; echo mount=$?; ` +
		`(sleep 0 & wait); echo fork=$?; echo ok > /tmp/w; echo write=$?; echo end; exec sleep 1000`
	f := testsuite.NewFixture(t, rt, spec.SpecOptions{Args: []string{"/bin/sh", "-c", script}}, Adapt)
	if err := rt.Run(context.Background(), f.ID, f.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	log := f.WaitLog(t, "end", 10*time.Second)
	for _, want := range []string{"Seccomp:\t2", "unshare=1", "mount=1", "fork=0", "write=0"} {
		if !strings.Contains(log, want) {
			t.Errorf("container log %q: want %q", log, want)
		}
	}
}

func TestDetectHybrid(t *testing.T) {
	if got, err := detectHybrid(t.TempDir()); got != "" || err != nil {
		t.Errorf("detectHybrid(plain dir) = %q, %v; want \"\", nil", got, err)
	}
	got, err := detectHybrid(cgroupRoot)
	t.Logf("this host: hide %q, %v", got, err)
}

// BenchmarkPrivateMountNS is the cost of the hybrid-mode wrapper: `crun
// list` started directly and from a fresh private mount namespace.
func BenchmarkPrivateMountNS(b *testing.B) {
	testsuite.RequireRoot(b, "crun")
	c, err := New(Options{Root: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	hidden := c.hybrid
	for _, mode := range []struct{ name, hide string }{{"direct", ""}, {"private", hidden}} {
		b.Run(mode.name, func(b *testing.B) {
			if mode.hide == "" && mode.name == "private" {
				b.Skip("host is not in hybrid mode")
			}
			c.hybrid = mode.hide
			for i := 0; i < b.N; i++ {
				if _, err := c.List(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestAgentBindMount runs the init the way the daemon does: a static binary
// bind-mounted read-only under /.forkbox (busybox: its applet is its
// base name, so not "agent"), a path the image lacks. crun
// creates the mount point in the rootfs (so it lands in the sandbox's upper
// dir as an empty file).
func TestAgentBindMount(t *testing.T) {
	rt := newRuntime(t)
	so := spec.SpecOptions{
		Args: []string{"/.forkbox/busybox", "sh", "-c", "echo agent-ok; exec sleep 1000"},
		Mounts: []specs.Mount{{Destination: "/.forkbox/busybox", Type: "bind", Source: "/bin/busybox",
			Options: []string{"rbind", "ro", "nosuid", "nodev"}}},
	}
	f := testsuite.NewFixture(t, rt, so, Adapt)
	if err := rt.Run(context.Background(), f.ID, f.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	f.WaitLog(t, "agent-ok", 10*time.Second)
	fi, err := os.Stat(filepath.Join(f.Rootfs, ".forkbox/busybox"))
	t.Logf("mount point in the host rootfs: %v, %v", fi, err)
}
