package daemon

import (
	"context"
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// A hibernated sandbox's rootfs is parked: unmounted with its mounts on
// record, its image's layers still counted in use, mounted again by wake.
func TestHibernateParksRootfs(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "park"})
	rootfs := h.d.rootfsDir(id)
	want := h.w.mountsAt(rootfs)
	if len(want) == 0 {
		t.Fatal("a running sandbox has no rootfs mount")
	}
	lowers := overlayLowers(want[0].Options)
	if len(lowers) == 0 {
		t.Fatalf("no overlay lowers in %+v", want)
	}
	for cycle := 1; cycle <= 2; cycle++ {
		if _, err := h.d.Hibernate(ctx, id); err != nil {
			t.Fatalf("cycle %d: hibernate: %v", cycle, err)
		}
		if m := h.w.mountsAt(rootfs); m != nil {
			t.Errorf("cycle %d: hibernated, its rootfs is still mounted: %+v", cycle, m)
		}
		if got, err := h.d.parked(id); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("cycle %d: parked mounts %+v (%v), want %+v", cycle, got, err, want)
		}
		// Nothing mounts the layers now (the test's mounts are not the
		// host's): only the record keeps them from the layer collection.
		inUse := h.d.layersInUse()
		for _, l := range lowers {
			if !inUse[l] {
				t.Errorf("cycle %d: layer %s of a parked rootfs is not in use: %v", cycle, l, inUse)
			}
		}
		if _, err := h.d.Wake(ctx, id); err != nil {
			t.Fatalf("cycle %d: wake: %v", cycle, err)
		}
		if got := h.w.mountsAt(rootfs); !reflect.DeepEqual(got, want) {
			t.Errorf("cycle %d: woken with rootfs mounts %+v, want %+v", cycle, got, want)
		}
		if _, err := os.Stat(h.d.parkedPath(id)); !os.IsNotExist(err) {
			t.Errorf("cycle %d: the parked record is left after wake (%v)", cycle, err)
		}
	}
}

// A parked record that cannot be read fails the wake with Internal and
// leaves the sandbox hibernated, its rootfs unmounted; a sandbox hibernated
// without a record (an older daemon's) wakes on the rootfs it kept.
func TestWakeParkedRecord(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "rec"})
	if _, err := h.d.Hibernate(ctx, id); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(h.d.parkedPath(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "{", "[]", `[{"Type":"overlay"}`} {
		if err := os.WriteFile(h.d.parkedPath(id), []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := h.d.Wake(ctx, id); !errors.Is(err, errdefs.ErrInternal) {
			t.Errorf("record %q: wake got %v, want Internal", bad, err)
		}
		if st := h.state(id).State; st != store.StateHibernated {
			t.Errorf("record %q: %s after a failed wake, want hibernated", bad, st)
		}
		if m := h.w.mountsAt(h.d.rootfsDir(id)); m != nil {
			t.Errorf("record %q: rootfs mounted by a failed wake: %+v", bad, m)
		}
	}
	if err := os.WriteFile(h.d.parkedPath(id), good, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Wake(ctx, id); err != nil {
		t.Fatalf("wake with the record back: %v", err)
	}
	// Hibernated by a daemon before parking: mounted, no record.
	if _, err := h.d.Hibernate(ctx, id); err != nil {
		t.Fatal(err)
	}
	ms, _ := h.d.parked(id)
	if err := h.w.MountAll(ctx, ms, h.d.rootfsDir(id)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(h.d.parkedPath(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Wake(ctx, id); err != nil {
		t.Fatalf("wake without a record: %v", err)
	}
	if m := h.w.mountsAt(h.d.rootfsDir(id)); m == nil {
		t.Error("woken without a record: its rootfs is not mounted")
	}
}
