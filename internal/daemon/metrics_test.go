package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// TestSandboxMetrics reads a sandbox's counters from its cgroup files and
// its writable layer; what cannot be read is named, not fatal.
func TestSandboxMetrics(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "m", CPU: "0.5", Memory: "128Mi", Disk: "0"})
	h.d.cgroupRoot = t.TempDir()
	cg := h.d.cgroupPath(id)
	for name, v := range map[string]string{
		"cpuacct" + cg + "/cpuacct.usage":        "3000000000",
		"memory" + cg + "/memory.usage_in_bytes": "1048576",
		"memory" + cg + "/memory.limit_in_bytes": "134217728",
		"pids" + cg + "/pids.current":            "4",
		"pids" + cg + "/pids.max":                "max",
	} {
		p := filepath.Join(h.d.cgroupRoot, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(v), 0o644)
	}
	os.WriteFile(filepath.Join(h.upper(id), "blob"), bytes.Repeat([]byte("x"), 1<<20), 0o644)

	list, err := h.d.SandboxMetrics(ctx, "m")
	if err != nil || len(list) != 1 {
		t.Fatalf("metrics: %v %v", list, err)
	}
	m := list[0]
	if m.CPUSeconds != 3 || m.CPULimit != 0.5 || m.MemoryBytes != 1<<20 || m.MemoryLimit != 128<<20 || m.Pids != 4 {
		t.Errorf("got %+v", m)
	}
	if m.PidsLimit != 1024 {
		t.Errorf("pids limit: got %d, want the config's 1024 (the cgroup says max)", m.PidsLimit)
	}
	if m.DiskBytes < 1<<20 || m.DiskLimit != 0 {
		t.Errorf("disk: got %d of %d, want at least 1 MiB of no limit", m.DiskBytes, m.DiskLimit)
	}
	if _, ok := m.Unavailable["net"]; !ok || len(m.Unavailable) != 1 {
		t.Errorf("unavailable: got %v, want only net (the fake network has no veth)", m.Unavailable)
	}
	if all, err := h.d.SandboxMetrics(ctx, ""); err != nil || len(all) != 1 || all[0].Sandbox.ID != id {
		t.Errorf("all: got %v %v", all, err)
	}
	if _, err := h.d.SandboxMetrics(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("unknown: got %v, want NotFound", err)
	}
	if err := h.d.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.SandboxMetrics(ctx, id); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("closed: got %v, want FailedPrecondition", err)
	}
}

// TestCopyRecorded: a copy in goes through the agent and is recorded in
// the ledger; a bad stream is an InvalidArgument, recorded too.
func TestCopyRecorded(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "c"})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("hi"))
	tw.Close()
	// The fake runs its agents on the host: the target is a temp dir.
	dir := t.TempDir()
	res, err := h.d.CopyTo(ctx, id, dir, &buf)
	if err != nil || res.Entries != 1 {
		t.Fatalf("copy: %+v %v", res, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "hi" {
		t.Errorf("copied f: %q %v", b, err)
	}
	var out bytes.Buffer
	if _, err := h.d.CopyFrom(ctx, id, filepath.Join(dir, "f"), &out); err != nil || out.Len() == 0 {
		t.Errorf("copy from: %d bytes, %v", out.Len(), err)
	}
	if _, err := h.d.CopyTo(ctx, id, dir, bytes.NewReader([]byte("not a tar stream, not at all: 512 bytes are needed for a header"))); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad stream: got %v, want InvalidArgument", err)
	}
	n := 0
	for _, e := range h.events(id) {
		if e == store.EventFilesCopied {
			n++
		}
	}
	if n != 2 || !slices.Contains(h.events(id), store.EventSandboxReady) {
		t.Errorf("ledger %v: want two files.copied", h.events(id))
	}
}
