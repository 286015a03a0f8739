package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func TestCheckPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		class    error
	}{
		{"/a/b", "/a/b", nil},
		{"/a//b/./c/", "/a/b/c", nil},
		{"/", "/", nil},
		{"", "", errdefs.ErrInvalidArgument},
		{"a/b", "", errdefs.ErrInvalidArgument},
		{"/a/../b", "", errdefs.ErrInvalidArgument},
		{"/..", "", errdefs.ErrInvalidArgument},
		{"/a/..", "", errdefs.ErrInvalidArgument},
		{"/a\x00b", "", errdefs.ErrInvalidArgument},
		{"/a/..b/c..", "/a/..b/c..", nil},
	} {
		got, err := checkPath(tc.in)
		if got != tc.want || (tc.class == nil) != (err == nil) || (err != nil && errdefs.Class(err) != tc.class) {
			t.Errorf("checkPath(%q): got %q, %v; want %q, class %v", tc.in, got, err, tc.want, tc.class)
		}
	}
}

func TestFiles(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	dir := t.TempDir()

	p := filepath.Join(dir, "sub/deeper/f.txt")
	if err := c.WriteFile(ctx, p, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := c.ReadFile(ctx, p)
	if err != nil || string(got) != "hello" {
		t.Fatalf("ReadFile: got %q, %v; want hello", got, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode: got %v, %v; want 0600", fi.Mode(), err)
	}
	// Overwrite with a large file, default mode.
	big := bytes.Repeat([]byte{0xab, 0, 1}, 1<<20)
	if err := c.WriteFile(ctx, p, big, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadFile(ctx, p); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("ReadFile big: got %d bytes, %v; want %d", len(got), err, len(big))
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Errorf("default mode: got %v, want 0644", fi.Mode())
	}
	// Empty file.
	if err := c.WriteFile(ctx, filepath.Join(dir, "empty"), nil, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadFile(ctx, filepath.Join(dir, "empty")); err != nil || len(got) != 0 {
		t.Errorf("ReadFile empty: got %q, %v", got, err)
	}

	ents, err := c.ListFiles(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	if len(ents) != 2 || ents[0].Name != "empty" || ents[0].IsDir || ents[1].Name != "sub" || !ents[1].IsDir || ents[0].ModTime.IsZero() {
		t.Errorf("ListFiles: got %+v, want empty (file) and sub (dir)", ents)
	}
	sub, err := c.ListFiles(ctx, filepath.Join(dir, "sub/deeper"))
	if err != nil || len(sub) != 1 || sub[0].Size != int64(len(big)) || sub[0].Mode.Perm() != 0o644 {
		t.Errorf("ListFiles sub: got %+v, %v", sub, err)
	}
	// No temp files left behind.
	if ents, _ := os.ReadDir(filepath.Join(dir, "sub/deeper")); len(ents) != 1 {
		t.Errorf("got %d entries in the write dir, want 1 (no temp files)", len(ents))
	}
}

func TestFileErrors(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(MaxFileSize + 1)
	f.Close()

	for _, tc := range []struct {
		name  string
		call  func() error
		class error
	}{
		{"read missing", func() error { _, err := c.ReadFile(ctx, dir+"/nope"); return err }, errdefs.ErrNotFound},
		{"read traversal", func() error { _, err := c.ReadFile(ctx, dir+"/../etc/passwd"); return err }, errdefs.ErrInvalidArgument},
		{"read relative", func() error { _, err := c.ReadFile(ctx, "etc/passwd"); return err }, errdefs.ErrInvalidArgument},
		{"read NUL", func() error { _, err := c.ReadFile(ctx, "/etc/pass\x00wd"); return err }, errdefs.ErrInvalidArgument},
		{"read dir", func() error { _, err := c.ReadFile(ctx, dir); return err }, errdefs.ErrInvalidArgument},
		{"read too big", func() error { _, err := c.ReadFile(ctx, huge); return err }, errdefs.ErrResourceExhausted},
		{"write traversal", func() error { return c.WriteFile(ctx, dir+"/a/../../x", []byte("x"), 0) }, errdefs.ErrInvalidArgument},
		{"write traversal big body", func() error {
			return c.WriteFile(ctx, dir+"/../x", make([]byte, 4<<20), 0)
		}, errdefs.ErrInvalidArgument},
		{"write too big", func() error { return c.WriteFile(ctx, dir+"/x", make([]byte, MaxFileSize+1), 0) }, errdefs.ErrResourceExhausted},
		{"write onto dir", func() error { return c.WriteFile(ctx, dir, []byte("x"), 0) }, errdefs.ErrInvalidArgument},
		{"list missing", func() error { _, err := c.ListFiles(ctx, dir+"/nope"); return err }, errdefs.ErrNotFound},
		{"list file", func() error { _, err := c.ListFiles(ctx, huge); return err }, errdefs.ErrInvalidArgument},
		{"list traversal", func() error { _, err := c.ListFiles(ctx, "/tmp/.."); return err }, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if errdefs.Class(err) != tc.class {
				t.Errorf("got %v (class %s), want class %s", err, errdefs.ClassName(err), errdefs.ClassName(tc.class))
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Errorf("a refused write left %s/x behind", dir)
	}
}

func TestClassFromName(t *testing.T) {
	for _, c := range allClasses {
		if got := ClassFromName(errdefs.ClassName(c)); got != c {
			t.Errorf("ClassFromName(%q): got %v, want %v", errdefs.ClassName(c), got, c)
		}
	}
	if got := ClassFromName("Bogus"); got != errdefs.ErrUnknown {
		t.Errorf("ClassFromName(Bogus): got %v, want Unknown", got)
	}
}
