package credentials

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

func testSealer(t *testing.T) *Sealer {
	t.Helper()
	s, err := NewSealer(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spec  Spec
		value string
		class func(error) bool
	}{
		{"env", Spec{Name: "gh", Env: "GH_TOKEN"}, "v", nil},
		{"file", Spec{Name: "key.pem", File: "key.pem"}, "v", nil},
		{"both", Spec{Name: "k", Env: "K", File: "k"}, "v", nil},
		{"no target", Spec{Name: "k"}, "v", errdefs.IsInvalidArgument},
		{"bad name", Spec{Name: "../x", Env: "X"}, "v", errdefs.IsInvalidArgument},
		{"empty name", Spec{Env: "X"}, "v", errdefs.IsInvalidArgument},
		{"bad env", Spec{Name: "k", Env: "1X"}, "v", errdefs.IsInvalidArgument},
		{"env with =", Spec{Name: "k", Env: "A=B"}, "v", errdefs.IsInvalidArgument},
		{"file traversal", Spec{Name: "k", File: "../../etc/passwd"}, "v", errdefs.IsInvalidArgument},
		{"file with slash", Spec{Name: "k", File: "a/b"}, "v", errdefs.IsInvalidArgument},
		{"file dot-dot", Spec{Name: "k", File: ".."}, "v", errdefs.IsInvalidArgument},
		{"largest value", Spec{Name: "k", Env: "K"}, strings.Repeat("x", MaxBytes), nil},
		{"oversized value", Spec{Name: "k", Env: "K"}, strings.Repeat("x", MaxBytes+1), errdefs.IsResourceExhausted},
	} {
		err := Check(tc.spec, tc.value)
		switch {
		case tc.class == nil && err != nil:
			t.Errorf("%s: got %v, want no error", tc.name, err)
		case tc.class != nil && !tc.class(err):
			t.Errorf("%s: got %v, want an error of the right class", tc.name, err)
		}
	}
}

func TestSealOpen(t *testing.T) {
	s := testSealer(t)
	sealed := s.Seal("gh", []byte("secret-value"))
	if bytes.Contains(sealed, []byte("secret-value")) {
		t.Fatal("sealed value contains the clear value")
	}
	if got, err := s.Open("gh", sealed); err != nil || string(got) != "secret-value" {
		t.Fatalf("open: got %q, %v; want secret-value", got, err)
	}
	if bytes.Equal(sealed, s.Seal("gh", []byte("secret-value"))) {
		t.Error("two seals of one value are equal: the nonce is not fresh")
	}
	if _, err := s.Open("other", sealed); !isInternal(err) {
		t.Errorf("open under another name: got %v, want Internal", err)
	}
	tampered := append([]byte(nil), sealed...)
	tampered[len(tampered)-1] ^= 1
	if _, err := s.Open("gh", tampered); !isInternal(err) {
		t.Errorf("open of an altered value: got %v, want Internal", err)
	}
	for _, short := range [][]byte{nil, sealed[:5], sealed[:12]} {
		if _, err := s.Open("gh", short); !isInternal(err) {
			t.Errorf("open of %d bytes: got %v, want Internal", len(short), err)
		}
	}
	other, _ := NewSealer(bytes.Repeat([]byte{8}, 32))
	if _, err := other.Open("gh", sealed); !isInternal(err) {
		t.Errorf("open under another key: got %v, want Internal", err)
	}
}

func TestOpenSealerCreatesKeyOnce(t *testing.T) {
	dir := t.TempDir()
	s1, err := OpenSealer(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, KeyFile)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Size() != 32 {
		t.Errorf("key file: got mode %v size %d, want 0600 and 32 bytes", st.Mode().Perm(), st.Size())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("state dir holds %d entries, want only the key (no temp file left)", len(ents))
	}
	s2, err := OpenSealer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s2.Open("n", s1.Seal("n", []byte("v"))); err != nil || string(v) != "v" {
		t.Errorf("a reopened key does not open what the first sealed: %q, %v", v, err)
	}
}

func TestOpenSealerConcurrentFirstStartsAgree(t *testing.T) {
	dir := t.TempDir()
	sealers := make([]*Sealer, 8)
	var wg sync.WaitGroup
	for i := range sealers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := OpenSealer(dir)
			if err != nil {
				t.Error(err)
			}
			sealers[i] = s
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	sealed := sealers[0].Seal("n", []byte("v"))
	for i, s := range sealers {
		if _, err := s.Open("n", sealed); err != nil {
			t.Errorf("sealer %d has another key: %v", i, err)
		}
	}
}

func TestOpenSealerRejectsBadKey(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenSealer(dir); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("got %v, want FailedPrecondition", err)
	}
	if _, err := OpenSealer(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing state dir: got no error")
	}
}

func TestInherit(t *testing.T) {
	s := testSealer(t)
	src := []*store.Credential{
		{SandboxID: "sb-1", Name: "gh", Env: "GH_TOKEN", Sealed: s.Seal("gh", []byte("shared"))},
		{SandboxID: "sb-1", Name: "db", File: "db", PerFork: true, Sealed: s.Seal("db", []byte("parent-only"))},
	}
	if _, err := Inherit(s, src, nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("per-fork without a value: got %v, want FailedPrecondition", err)
	}
	if _, err := Inherit(s, src, map[string]string{"db": "x", "nope": "y"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("value for an unknown credential: got %v, want InvalidArgument", err)
	}
	if _, err := Inherit(s, src, map[string]string{"db": strings.Repeat("x", MaxBytes+1)}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("oversized value: got %v, want ResourceExhausted", err)
	}
	got, err := Inherit(s, src, map[string]string{"db": "child"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d credentials, want 2", len(got))
	}
	for _, c := range got {
		v, err := s.Open(c.Name, c.Sealed)
		want := map[string]string{"gh": "shared", "db": "child"}[c.Name]
		if err != nil || string(v) != want {
			t.Errorf("%s: got %q, %v; want %q", c.Name, v, err, want)
		}
	}
	if v, _ := s.Open("db", src[1].Sealed); string(v) != "parent-only" {
		t.Errorf("Inherit changed the source's credential: %q", v)
	}
	if got, err := Inherit(s, nil, nil); err != nil || len(got) != 0 {
		t.Errorf("no credentials: got %v, %v", got, err)
	}
}

func TestEnv(t *testing.T) {
	s := testSealer(t)
	creds := []*store.Credential{
		{Name: "gh", Env: "GH_TOKEN", Sealed: s.Seal("gh", []byte("t1"))},
		{Name: "f", File: "f", Sealed: s.Seal("f", []byte("file-only"))},
	}
	env, err := Env(s, creds)
	if err != nil || len(env) != 1 || env["GH_TOKEN"] != "t1" {
		t.Errorf("got %v, %v; want GH_TOKEN=t1 only", env, err)
	}
	if env, err := Env(s, nil); env != nil || err != nil {
		t.Errorf("no credentials: got %v, %v; want nil", env, err)
	}
	creds[0].Sealed = s.Seal("other", []byte("t1"))
	if _, err := Env(s, creds); !isInternal(err) {
		t.Errorf("a value sealed under another name: got %v, want Internal", err)
	}
}

func isInternal(err error) bool { return errors.Is(err, errdefs.ErrInternal) }
