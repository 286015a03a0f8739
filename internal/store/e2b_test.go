package store

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func TestE2BObjects(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"))
	ctx := context.Background()
	if _, err := s.GetE2BObject(ctx, "sb-1"); !errdefs.IsNotFound(err) {
		t.Fatalf("get before put: got %v, want NotFound", err)
	}
	a := &E2BObject{ID: "sb-1", Kind: E2BKindSandbox, Template: "base", Metadata: map[string]string{"k": "v"}}
	if err := s.PutE2BObject(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.PutE2BObject(ctx, &E2BObject{ID: "ck-1", Kind: E2BKindSnapshot, Name: "snap", Source: "sb-1"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetE2BObject(ctx, "sb-1")
	if err != nil || got.Template != "base" || got.Metadata["k"] != "v" || got.Kind != E2BKindSandbox {
		t.Fatalf("get: got %+v, %v", got, err)
	}
	list, err := s.ListE2BObjects(ctx, E2BKindSnapshot)
	if err != nil || len(list) != 1 || list[0].Name != "snap" || list[0].Source != "sb-1" {
		t.Fatalf("list snapshots: got %+v, %v", list, err)
	}
	if err := s.DeleteE2BObject(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetE2BObject(ctx, "sb-1"); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: got %v, want NotFound", err)
	}
}
