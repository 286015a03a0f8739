package ocicli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func TestClassify(t *testing.T) {
	existsFirst := Errors{Runtime: "a", Rules: []Rule{AlreadyExists, NotFound, Precondition("already paused")}}
	notFoundFirst := Errors{Runtime: "b", Rules: []Rule{NotFound, AlreadyExists, Precondition("is in state")}}
	for _, c := range []struct {
		e    Errors
		msg  string
		want error
	}{
		{existsFirst, "container `x` already exists", errdefs.ErrAlreadyExists},
		{existsFirst, "Already Exists; no such file", errdefs.ErrAlreadyExists},
		{notFoundFirst, "already exists; no such file", errdefs.ErrNotFound},
		{notFoundFirst, `container "x" does not exist`, errdefs.ErrNotFound},
		{existsFirst, "container is not running", errdefs.ErrFailedPrecondition},
		{existsFirst, "container already paused", errdefs.ErrFailedPrecondition},
		{notFoundFirst, "container already paused", errdefs.ErrInternal},
		{notFoundFirst, "container is in state stopped", errdefs.ErrFailedPrecondition},
		{existsFirst, "something broke", errdefs.ErrInternal},
	} {
		if got := c.e.Classify(c.msg); got != c.want {
			t.Errorf("%s.Classify(%q) = %v, want %v", c.e.Runtime, c.msg, got, c.want)
		}
	}
}

func TestWrap(t *testing.T) {
	e := Errors{Runtime: "x", Rules: []Rule{NotFound}}
	err := e.Wrap(context.Background(), "state", "id1", errors.New("exit status 1"), "a\nb\nc\nd\ne\nf\ncontainer does not exist\n")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "x state id1: c | d | e | f | container does not exist") {
		t.Errorf("got %v, want NotFound with the last 5 lines", err)
	}
	if err := e.Wrap(context.Background(), "kill", "id1", errors.New("exit status 2"), " "); !strings.Contains(err.Error(), "exit status 2") {
		t.Errorf("empty stderr: got %v, want the exit error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cerr := e.Wrap(ctx, "run", "id1", errors.New("killed"), "not found")
	if !errors.Is(cerr, context.Canceled) || errdefs.IsNotFound(cerr) {
		t.Errorf("cancelled: got %v, want context.Canceled only", cerr)
	}
	re := Reclass(cerr, context.Canceled, errdefs.ErrInvalidArgument)
	if !errdefs.IsInvalidArgument(re) || errors.Is(re, context.Canceled) {
		t.Errorf("Reclass: got %v, want InvalidArgument only", re)
	}
	if re := Reclass(errdefs.ErrInternal, errdefs.ErrNotFound, errdefs.ErrInvalidArgument); re != errdefs.ErrInternal {
		t.Errorf("Reclass of another class: got %v, want it unchanged", re)
	}
}

func TestValidID(t *testing.T) {
	for _, id := range []string{"", ".", "..", "a/b", "a b", strings.Repeat("x", 129), "a\x00"} {
		if err := ValidID("rt", id); !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), "rt: ") {
			t.Errorf("ValidID(%q) = %v, want InvalidArgument prefixed rt:", id, err)
		}
	}
	if err := ValidID("rt", "fbx-1234"); err != nil {
		t.Errorf("ValidID(fbx-1234) = %v, want nil", err)
	}
}

func TestParse(t *testing.T) {
	for _, out := range []string{"", " null\n"} {
		if ss, err := ParseList("rt", []byte(out)); err != nil || len(ss) != 0 {
			t.Errorf("ParseList(%q) = %v, %v; want empty", out, ss, err)
		}
	}
	ss, err := ParseList("rt", []byte(`[{"id":"a","pid":7,"status":"running","bundle":"/b"}]`))
	if err != nil || len(ss) != 1 || ss[0].Runtime().Pid != 7 || ss[0].Runtime().Bundle != "/b" {
		t.Errorf("ParseList = %+v, %v", ss, err)
	}
	if _, err := ParseList("rt", []byte("{")); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("ParseList(bad) = %v, want Internal", err)
	}
	if _, err := ParseState("rt", "a", []byte("x")); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("ParseState(bad) = %v, want Internal", err)
	}
}

func TestStdio(t *testing.T) {
	dir := t.TempDir()
	if err := CheckNew(context.Background(), nil, "rt", "run", "a", "rel"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative bundle: got %v, want InvalidArgument", err)
	}
	if err := CheckNew(context.Background(), nil, "rt", "run", "a", dir); !errdefs.IsNotFound(err) {
		t.Errorf("no config.json: got %v, want NotFound", err)
	}
	os.WriteFile(filepath.Join(dir, "stdio.log"), []byte("old\n"), 0o600)
	s, err := OpenStdio(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Log.WriteString("new\n")
	if got := ReadFrom(s.LogPath, s.Start); got != "new\n" {
		t.Errorf("ReadFrom = %q, want %q", got, "new\n")
	}
	if got := ReadFrom(s.LogPath, 100); got != "" {
		t.Errorf("ReadFrom past the end = %q, want empty", got)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}
