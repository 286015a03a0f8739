package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// A directory far too big for one JSON frame is listed in several.
func TestListManyEntries(t *testing.T) {
	c := startServer(t, Config{})
	dir := t.TempDir()
	const n = 20000
	for i := range n {
		// Long names, so the listing is several MiB.
		name := filepath.Join(dir, "file-with-a-rather-long-name-to-make-the-listing-bigger-"+itoa(100000+i))
		if err := os.WriteFile(name, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The deadline bounds the listing, not the 20,000 files made above
	// (which took most of two minutes on a host under a load of 1,000).
	ctx := testCtx(t)
	ents, err := c.ListFiles(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != n {
		t.Fatalf("got %d entries, want %d", len(ents), n)
	}
	for i, e := range ents {
		want := "file-with-a-rather-long-name-to-make-the-listing-bigger-" + itoa(100000+i)
		if e.Name != want || e.IsDir || e.Size != 0 || e.Mode.Perm() != 0o644 {
			t.Fatalf("entry %d: got %+v, want %s, a 0644 empty file", i, e, want)
		}
	}

	// A client that does not ask for a stream gets one result frame: too
	// big here, so ResourceExhausted, and fine for a small directory.
	var res listResult
	err = c.simple(ctx, request{Op: opList, Path: dir}, &res)
	if !errdefs.IsResourceExhausted(err) {
		t.Errorf("unstreamed list of %d entries: got %v, want ResourceExhausted", n, err)
	}
	small := t.TempDir()
	os.WriteFile(filepath.Join(small, "a"), []byte("x"), 0o600)
	res = listResult{}
	if err := c.simple(ctx, request{Op: opList, Path: small}, &res); err != nil || len(res.Entries) != 1 || res.Entries[0].Name != "a" {
		t.Errorf("unstreamed list: got %+v, %v; want entry a", res, err)
	}
	if ents, err := c.ListFiles(ctx, t.TempDir()); err != nil || ents == nil || len(ents) != 0 {
		t.Errorf("empty dir: got %#v, %v; want an empty slice", ents, err)
	}
}
