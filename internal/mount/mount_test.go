package mount

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("mount tests need root")
	}
	t.Skip("mount tests need root")
}

func mkfile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOverlayAndUnmount(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	lower1, lower2, upper, work, target := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	mkfile(t, filepath.Join(lower1, "a"), "bottom")
	mkfile(t, filepath.Join(lower2, "a"), "top")
	mkfile(t, filepath.Join(lower1, "b"), "b")
	m := Mount{Type: "overlay", Source: "overlay", Options: []string{
		"lowerdir=" + lower2 + ":" + lower1, "upperdir=" + upper, "workdir=" + work,
	}}
	if err := All(ctx, []Mount{m}, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(ctx, target) })
	if b, _ := os.ReadFile(filepath.Join(target, "a")); string(b) != "top" {
		t.Errorf("a: got %q, want top", b)
	}
	if mp, err := IsMountPoint(target); err != nil || !mp {
		t.Errorf("IsMountPoint(%s): got %v, %v, want true", target, mp, err)
	}
	if mp, _ := IsMountPoint(upper); mp {
		t.Errorf("IsMountPoint(%s): got true, want false", upper)
	}
	under, err := Under(filepath.Dir(target))
	if err != nil || len(under) != 1 || under[0] != target {
		t.Errorf("Under: got %v, %v, want [%s]", under, err, target)
	}
	// Busy target: Unmount falls back to a lazy detach.
	f, err := os.Open(filepath.Join(target, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Unmount(ctx, target); err != nil {
		t.Fatalf("Unmount busy: %v", err)
	}
	if mp, _ := IsMountPoint(target); mp {
		t.Errorf("still mounted after Unmount")
	}
	if err := Unmount(ctx, target); err != nil {
		t.Errorf("second Unmount: got %v, want nil", err)
	}
	if err := Unmount(ctx, filepath.Join(target, "missing")); err != nil {
		t.Errorf("Unmount of missing path: got %v, want nil", err)
	}
}

// TestOverlayLongOptions mounts an overlay whose option string exceeds a
// page, which needs the fsopen path.
func TestOverlayLongOptions(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	var lowers []string
	for i := 0; i < 40; i++ {
		d := filepath.Join(base, strings.Repeat("x", 100)+"-"+string(rune('a'+i%26))+strings.Repeat("y", i))
		mkfile(t, filepath.Join(d, "f"), d)
		lowers = append(lowers, d)
	}
	upper, work, target := t.TempDir(), t.TempDir(), t.TempDir()
	opts := []string{"lowerdir=" + strings.Join(lowers, ":"), "upperdir=" + upper, "workdir=" + work}
	if n := len(strings.Join(opts, ",")); n <= pageSize {
		t.Fatalf("options only %d bytes", n)
	}
	if err := All(ctx, []Mount{{Type: "overlay", Source: "overlay", Options: opts}}, target); err != nil {
		t.Fatalf("long overlay: %v", err)
	}
	t.Cleanup(func() { _ = Unmount(ctx, target) })
	if b, _ := os.ReadFile(filepath.Join(target, "f")); string(b) != lowers[0] {
		t.Errorf("f: got %q, want the topmost lower's %q", b, lowers[0])
	}
}

func TestBindReadOnly(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	src, target := t.TempDir(), t.TempDir()
	mkfile(t, filepath.Join(src, "f"), "f")
	if err := Bind(ctx, src, target, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountAll(ctx, target) })
	if b, _ := os.ReadFile(filepath.Join(target, "f")); string(b) != "f" {
		t.Errorf("f: got %q", b)
	}
	if err := os.WriteFile(filepath.Join(target, "g"), nil, 0o644); err == nil {
		t.Errorf("write to read-only bind: got nil error")
	}
	if err := UnmountAll(ctx, target); err != nil {
		t.Fatal(err)
	}
	if pts, _ := Under(target); len(pts) != 0 {
		t.Errorf("Under after UnmountAll: got %v", pts)
	}
}

func TestRemountReadOnly(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	target := t.TempDir()
	if err := All(ctx, []Mount{{Type: "tmpfs", Source: "forkbox-test", Options: []string{"nosuid", "nodev", "size=1m"}}}, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountAll(ctx, target) })
	mkfile(t, filepath.Join(target, "f"), "f")
	if err := Remount(ctx, target, []string{"ro", "nosuid", "nodev"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(target, "f")); string(b) != "f" {
		t.Errorf("f after remount: got %q, want %q", b, "f")
	}
	if err := os.WriteFile(filepath.Join(target, "g"), nil, 0o644); err == nil {
		t.Errorf("write to a read-only remount: got nil error")
	}
	if err := Remount(ctx, filepath.Join(target, "missing"), []string{"ro"}); !errdefs.IsNotFound(err) {
		t.Errorf("remount of a missing path: got %v, want NotFound", err)
	}
}

func TestMountErrors(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	target := t.TempDir()
	err := All(ctx, []Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/nonexistent-forkbox"}}}, target)
	if err == nil {
		_ = Unmount(ctx, target)
		t.Fatal("overlay on a missing lower: got nil error")
	}
	if err := All(ctx, []Mount{{}}, target); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty mount: got %v, want InvalidArgument", err)
	}
}

func TestParseMountinfo(t *testing.T) {
	in := "36 35 98:0 /mnt1 /mnt\\040two rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n" +
		"37 36 0:5 / /mnt\\040two/o rw shared:2 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
	got, err := parseMountinfo([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d entries, want 2", len(got))
	}
	if got[0].Mountpoint != "/mnt two" || got[0].Root != "/mnt1" || got[0].FSType != "ext3" || got[0].Source != "/dev/root" || got[0].Shared() {
		t.Errorf("entry 0: got %+v", got[0])
	}
	if got[1].ID != 37 || got[1].Parent != 36 || got[1].SuperOptions != "rw,lowerdir=/l,upperdir=/u,workdir=/w" || !got[1].Shared() || got[1].PeerGroup != 2 {
		t.Errorf("entry 1: got %+v", got[1])
	}
}

func TestRestrict(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	mkfile(t, filepath.Join(dir, "f"), "kept")
	t.Cleanup(func() { _ = UnmountAll(ctx, dir) })
	for i := 0; i < 2; i++ { // idempotent: the second call stacks nothing
		if err := Restrict(ctx, dir); err != nil {
			t.Fatalf("Restrict #%d: %v", i+1, err)
		}
	}
	infos, err := List()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, in := range infos {
		if in.Mountpoint != dir {
			continue
		}
		n++
		for _, want := range []string{"rw", "nosuid", "nodev", "noatime"} {
			if !strings.Contains(","+in.Options+",", ","+want+",") {
				t.Errorf("options of %s: got %s, want %s", dir, in.Options, want)
			}
		}
	}
	if n != 1 {
		t.Errorf("mounts on %s: got %d, want 1", dir, n)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "kept" {
		t.Errorf("content through the bind mount: got %q, %v, want kept", b, err)
	}
}
