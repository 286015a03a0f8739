package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// A lifetime is stored with the sandbox, survives a reopen, and its timeout
// lands in the config that checkpoints copy.
func TestSetLifetime(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "forkbox.db")
	s := open(t, path)
	sb := &Sandbox{ID: "sb-1", Name: "one", State: StateRunning, Image: "img", Runtime: "gvisor",
		Config: SandboxConfig{Egress: "none", TimeoutMS: 1000, OnTimeout: "hibernate"}}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Deadline.IsZero() || !got.LifetimeFrom.Equal(time.UnixMilli(got.CreatedAt.UnixMilli())) {
		t.Errorf("new: deadline %v, lifetime from %v; want zero, created_at %v", got.Deadline, got.LifetimeFrom, got.CreatedAt)
	}
	deadline, from := time.UnixMilli(time.Now().Add(time.Hour).UnixMilli()), time.UnixMilli(time.Now().UnixMilli())
	if err := s.SetLifetime(ctx, "sb-1", 3_600_000, deadline, from); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path)
	got, err = s.GetSandbox(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Deadline.Equal(deadline) || !got.LifetimeFrom.Equal(from) || got.Config.TimeoutMS != 3_600_000 || got.Config.OnTimeout != "hibernate" {
		t.Errorf("after reopen: deadline %v from %v timeout %d on_timeout %q; want %v %v 3600000 hibernate",
			got.Deadline, got.LifetimeFrom, got.Config.TimeoutMS, got.Config.OnTimeout, deadline, from)
	}
	if err := s.SetLifetime(ctx, "sb-nope", 0, time.Time{}, from); !errdefs.IsNotFound(err) {
		t.Errorf("unknown sandbox: got %v, want NotFound", err)
	}
}
