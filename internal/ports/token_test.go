package ports

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeysSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	k1, err := OpenKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, SecretFile))
	if err != nil || st.Mode().Perm() != 0o600 || st.Size() != 32 {
		t.Fatalf("secret file: %v, mode %v, %d bytes; want 0600 and 32 bytes", err, st.Mode(), st.Size())
	}
	k2, err := OpenKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k1.Token("sb-a") != k2.Token("sb-a") {
		t.Error("the token changed when the secret was opened again (daemon restart)")
	}
	other, _ := OpenKeys(t.TempDir())
	if other.Token("sb-a") == k1.Token("sb-a") {
		t.Error("two daemons' secrets give the same token")
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*tmp*"))
	if len(leftovers) != 0 {
		t.Errorf("temp files left: %v", leftovers)
	}
}

func TestKeysRejectBadSecret(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, SecretFile), []byte("short"), 0o600)
	if _, err := OpenKeys(dir); err == nil || !strings.Contains(err.Error(), "32") {
		t.Errorf("got %v, want an error about the secret's size", err)
	}
}

func TestTokenPerSandbox(t *testing.T) {
	k := NewKeys(make([]byte, 32))
	a, b := k.Token("sb-a"), k.Token("sb-b")
	if a == b || len(a) != 43 || strings.ContainsAny(a, "+/=") {
		t.Fatalf("tokens %q and %q: want distinct, 43 URL-safe characters", a, b)
	}
	for _, tc := range []struct {
		id, tok string
		want    bool
	}{
		{"sb-a", a, true},
		{"sb-b", b, true},
		{"sb-a", b, false}, // another sandbox's token
		{"sb-a", "", false},
		{"sb-a", a[:42], false},
		{"sb-a", a + "x", false},
		{"sb-a", strings.ToUpper(a), false},
	} {
		if got := k.Check(tc.id, tc.tok); got != tc.want {
			t.Errorf("Check(%s, %q) = %v, want %v", tc.id, tc.tok, got, tc.want)
		}
	}
}

func TestEqual(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{{"x", "x", true}, {"", "", true}, {"x", "y", false}, {"x", "xx", false}, {"abc", "abd", false}} {
		if got := equal(tc.a, tc.b); got != tc.want {
			t.Errorf("equal(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
