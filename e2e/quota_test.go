package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/mount"
)

// fill writes up to maxMiB MiB of zeros to path inside sb, synced, and
// returns how many MiB landed and whether the write failed with a disk
// quota (or full disk) error.
func fill(t *testing.T, sb *client.Sandbox, path string, maxMiB int) (int, bool) {
	t.Helper()
	out, errs, res := sh(t, sb, fmt.Sprintf("dd if=/dev/zero of=%s bs=1M count=%d conv=fsync 2>&1; echo rc=$?; sync; ls -l %s", path, maxMiB, path))
	full := strings.Contains(out, "quota exceeded") || strings.Contains(out, "No space left")
	if res.ExitCode != 0 {
		t.Fatalf("fill %s: exit %d: %s %s", path, res.ExitCode, out, errs)
	}
	var size int64
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 5 && strings.HasSuffix(l, path) {
			size, _ = strconv.ParseInt(f[4], 10, 64)
		}
	}
	if full == strings.Contains(out, "rc=0") {
		t.Errorf("fill %s: dd said %q", path, out)
	}
	t.Logf("fill %s: %d MiB, disk full: %v", path, size>>20, full)
	return int(size >> 20), full
}

// TestDiskQuota: a sandbox that writes past its disk limit gets EDQUOT and
// holds no more than the limit; a fork inherits the limit and is charged
// only for its own writes; an override lifts it; another sandbox and the
// ledger keep working after the fill.
func TestDiskQuota(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		other := newSandbox(t, clientOpts())
		o := clientOpts()
		o.Resources.Disk = "64Mi"
		sb := newSandbox(t, o)
		if got := sb.Info.GetResources().GetDisk(); got != "64Mi" {
			t.Errorf("Info.Resources.Disk: got %q, want 64Mi", got)
		}

		// 40 MiB kept, then the fill stops at the limit.
		if n, full := fill(t, sb, "/keep", 40); full || n != 40 {
			t.Fatalf("40 MiB under a 64 MiB limit: got %d MiB, full=%v", n, full)
		}
		n, full := fill(t, sb, "/fill", 200)
		if !full || n > 30 {
			t.Errorf("fill past the limit: got %d MiB more and full=%v, want EDQUOT after at most ~24 MiB", n, full)
		}
		// The sandbox, another sandbox and the ledger still work.
		mustSh(t, sb, "rm /fill; echo again > /after")
		if out := mustSh(t, other, "echo alive"); out != "alive\n" {
			t.Errorf("other sandbox after the fill: got %q", out)
		}
		ck, err := sb.Checkpoint(ctx, "after-fill")
		if err != nil {
			t.Fatalf("checkpoint after the fill: %v", err)
		}
		evs, err := sb.Events(ctx)
		if err != nil || len(evs) == 0 || evs[len(evs)-1].Type != "sandbox.checkpoint_created" {
			t.Errorf("ledger after the fill: last event %v, %v, want sandbox.checkpoint_created", evs[len(evs)-1:], err)
		}

		// A child of the 40 MiB checkpoint starts at zero and inherits 64 MiB.
		res, err := sb.Fork(ctx, client.ForkOptions{FromCheckpoint: ck.Id, Count: 1})
		if err != nil || res.Children[0].Err != nil {
			t.Fatalf("fork: %v %v", err, res)
		}
		child := res.Children[0].Sandbox
		defer child.Close(ctx)
		if got := child.Info.GetResources().GetDisk(); got != "64Mi" {
			t.Errorf("child's Resources.Disk: got %q, want 64Mi (inherited)", got)
		}
		if n, full := fill(t, child, "/own", 40); full || n != 40 {
			t.Errorf("child writes 40 MiB of its own: got %d MiB, full=%v (charged for its parent's data?)", n, full)
		}
		if n, full := fill(t, child, "/fill", 200); !full || n > 30 {
			t.Errorf("child past its inherited limit: got %d MiB, full=%v", n, full)
		}
		// An override lifts the limit.
		res, err = sb.Fork(ctx, client.ForkOptions{FromCheckpoint: ck.Id, Count: 1,
			Overrides: client.Overrides{Resources: client.Resources{Disk: "0"}}})
		if err != nil || res.Children[0].Err != nil {
			t.Fatalf("fork with disk 0: %v %v", err, res)
		}
		free := res.Children[0].Sandbox
		defer free.Close(ctx)
		if n, full := fill(t, free, "/big", 100); full || n != 100 {
			t.Errorf("child with disk 0 writes 100 MiB: got %d MiB, full=%v", n, full)
		}
	})
}

// TestDiskDefault: a sandbox that asks for nothing gets the daemon's
// --default-disk.
func TestDiskDefault(t *testing.T) {
	withDaemonFlags(t, "--default-disk", "48Mi")
	sb := newSandbox(t, clientOpts())
	if n, full := fill(t, sb, "/fill", 200); !full || n > 56 {
		t.Errorf("fill under --default-disk 48Mi: got %d MiB, full=%v", n, full)
	}
	mustSh(t, sb, "rm /fill && echo ok")
}

// TestIdentityFilesReadOnly: /etc/hostname, hosts, resolv.conf and
// machine-id live outside the writable layer and its limit; a sandbox
// cannot write them, and nothing grows in the state dir.
func TestIdentityFilesReadOnly(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		sb := newSandbox(t, clientOpts())
		files := []string{"hostname", "hosts", "resolv.conf", "machine-id"}
		sizes := func() map[string]int64 {
			out := map[string]int64{}
			for _, f := range files {
				fi, err := os.Stat(filepath.Join(env.stateDir, "sandboxes", sb.ID, "etc", f))
				if err != nil {
					t.Fatalf("bundle file: %v", err)
				}
				out[f] = fi.Size()
			}
			return out
		}
		before := sizes()
		for _, f := range files {
			out, _, res := sh(t, sb, fmt.Sprintf("head -c 1048576 /dev/zero >> /etc/%s 2>&1; echo rc=$?", f))
			if res.ExitCode != 0 || strings.Contains(out, "rc=0") {
				t.Errorf("append to /etc/%s: got %q, want a read-only error", f, out)
			}
		}
		if got := mustSh(t, sb, "cat /etc/hostname"); got != sb.Info.Hostname+"\n" {
			t.Errorf("/etc/hostname: got %q, want %q", got, sb.Info.Hostname)
		}
		after := sizes()
		for _, f := range files {
			if after[f] != before[f] {
				t.Errorf("bundle's etc/%s grew from %d to %d bytes", f, before[f], after[f])
			}
		}
	})
}

// TestHostSideLayersUnreachable: what sandboxes and images put on the host
// (layers, the pool, bundles) is below a root-only 0700 state dir, and the
// pool is mounted nosuid,nodev.
func TestHostSideLayersUnreachable(t *testing.T) {
	for _, d := range []string{env.stateDir, filepath.Join(env.stateDir, "images"), filepath.Join(env.stateDir, "snapshots")} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Errorf("%s: %v", d, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != 0o700 || st.Uid != 0 {
			t.Errorf("%s: mode %v owner %d, want 0700 and root", d, fi.Mode().Perm(), st.Uid)
		}
	}
	infos, err := mount.List()
	if err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(env.stateDir, "snapshots")
	var opts string
	for _, in := range infos {
		if in.Mountpoint == pool {
			opts = "," + in.Options + ","
		}
	}
	for _, want := range []string{"nosuid", "nodev"} {
		if !strings.Contains(opts, ","+want+",") {
			t.Errorf("pool %s mount options %q: want %s", pool, opts, want)
		}
	}
}

// TestDiskQuotaMemoryFork: a memory fork (gVisor) restores over its own
// writable layer, which has the inherited limit, and the source keeps its
// own after the checkpoint restored it in place.
func TestDiskQuotaMemoryFork(t *testing.T) {
	ctx := context.Background()
	o := clientOpts()
	o.Runtime = "gvisor"
	o.Resources.Disk = "48Mi"
	src := newSandbox(t, o)
	if n, full := fill(t, src, "/keep", 32); full || n != 32 {
		t.Fatalf("32 MiB under a 48 MiB limit: got %d MiB, full=%v", n, full)
	}
	res, err := src.Fork(ctx, client.ForkOptions{Count: 1, Memory: true})
	if err != nil || len(res.Sandboxes()) != 1 {
		t.Fatalf("memory fork: %v %+v", err, res)
	}
	child := res.Sandboxes()[0]
	defer child.Close(ctx)
	if n, full := fill(t, child, "/own", 200); !full || n < 32 || n > 56 {
		t.Errorf("memory-forked child: got %d MiB, full=%v, want EDQUOT after ~48 MiB of its own", n, full)
	}
	if n, full := fill(t, src, "/more", 200); !full || n > 24 {
		t.Errorf("source after the memory checkpoint: got %d MiB more, full=%v, want EDQUOT after ~16 MiB", n, full)
	}
}
