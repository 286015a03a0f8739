package runsc

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// TestFileContains: the needle is found wherever it lies, across the
// reader's 1 MiB chunks too, and not where it is only cut in two.
func TestFileContains(t *testing.T) {
	needle := []byte(AnnotationAppMemoryLimit)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		at   int // offset of the needle; -1: absent
		size int
		want bool
	}{
		{"start", 0, 3 << 20, true},
		{"end", 3<<20 - len(needle), 3 << 20, true},
		{"across the first chunk's end", 1<<20 + len(needle) - 5, 3 << 20, true},
		{"across the second chunk's end", 2<<20 + len(needle) + 1 - 5, 3 << 20, true}, // the second read is 1 MiB + 1
		{"absent", -1, 3 << 20, false},
		{"shorter than the needle", -1, 5, false},
		{"empty", -1, 0, false},
	} {
		b := bytes.Repeat([]byte{'x'}, tc.size)
		if tc.at >= 0 {
			copy(b[tc.at:], needle)
		} else if tc.size > 2*len(needle) {
			// Its halves, apart: no match.
			copy(b[1<<20-len(needle)/2:], needle[:len(needle)/2])
			copy(b[2<<20:], needle[len(needle)/2:])
		}
		p := filepath.Join(dir, tc.name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := fileContains(p, needle); err != nil || got != tc.want {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := fileContains(filepath.Join(dir, "missing"), needle); err == nil {
		t.Error("a missing file: no error")
	}
}

// TestEnforcesMemoryLimitFollowsTheBinary: a binary replaced at the same
// path (a stock runsc installed over the patched one) is read again.
func TestEnforcesMemoryLimitFollowsTheBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "runsc")
	r := &Runsc{opts: Options{Binary: bin}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for i, body := range []string{"patched " + AnnotationAppMemoryLimit, "stock", "patched again " + AnnotationAppMemoryLimit} {
		tmp := filepath.Join(dir, "new")
		if err := os.WriteFile(tmp, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, bin); err != nil { // as install(1) does: a new inode
			t.Fatal(err)
		}
		if got, want := r.EnforcesMemoryLimit(context.Background()), i != 1; got != want {
			t.Errorf("binary %d (%q): %v, want %v", i, body, got, want)
		}
	}
}
