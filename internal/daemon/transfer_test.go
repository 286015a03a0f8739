package daemon

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// TestAdoptMemImage: a memory image received from another node names
// this node's paths afterwards, and one whose spec binds any other host
// path into the sandbox is refused.
func TestAdoptMemImage(t *testing.T) {
	d := &Daemon{cfg: Config{AgentPath: "/opt/here/forkbox-agent"}}
	from, to := "/var/there/sandboxes/sb-1", "/var/here/sandboxes/sb-1"
	write := func(t *testing.T, mounts ...specs.Mount) string {
		dir := t.TempDir()
		s, err := spec.NewSpec(spec.SpecOptions{Rootfs: from + "/rootfs", Args: []string{"sh"}, MemoryBytes: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		s.Mounts = mounts
		b, _ := json.Marshal(s)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	ok := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/tmp", Type: "bind", Source: from + "/rootfs/tmp", Options: []string{"rbind"}},
		{Destination: "/etc/hosts", Type: "bind", Source: from + "//etc/../etc/hosts", Options: []string{"rbind"}}, // made read-only
		{Destination: agentMountPoint, Type: "bind", Source: "/opt/there/forkbox-agent", Options: []string{"rbind"}},
	}
	dir := write(t, ok...)
	if err := d.adoptMemImage(dir, to); err != nil {
		t.Fatalf("adopt: %v", err)
	}
	var got specs.Spec
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Root.Path != to+"/rootfs" || got.Mounts[1].Source != to+"/rootfs/tmp" || got.Mounts[2].Source != to+"/etc/hosts" ||
		got.Mounts[3].Source != d.cfg.AgentPath || got.Mounts[0].Source != "proc" ||
		!slices.Contains(got.Mounts[2].Options, "ro") || !slices.Contains(got.Mounts[3].Options, "ro") {
		t.Errorf("adopted spec: root %q, mounts %+v", got.Root.Path, got.Mounts)
	}
	for name, m := range map[string]specs.Mount{
		"a host dir":             {Destination: "/host", Type: "bind", Source: "/etc", Options: []string{"rbind"}},
		"a way up and out":       {Destination: "/x", Type: "bind", Source: from + "/../../../etc", Options: []string{"rbind"}},
		"a bind by options only": {Destination: "/x", Type: "none", Source: "/root", Options: []string{"bind"}},
		// Inside the bundle, writable: a restore later runs its hooks.
		"its own spec":       {Destination: "/x", Type: "bind", Source: from + "/config.json", Options: []string{"rbind"}},
		"its pod's bundle":   {Destination: "/x", Type: "bind", Source: from + "/pod", Options: []string{"rbind"}},
		"the root elsewhere": {Destination: "/mnt", Type: "bind", Source: from + "/rootfs", Options: []string{"rbind"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := d.adoptMemImage(write(t, append(ok[:1:1], m)...), to)
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
		})
	}
	// More than a sandbox has (spec.CheckForeign has the rest): a hook,
	// which the runtime runs on this host as root, is refused; the pod
	// the sender names is dropped (a restore here names its own).
	rewrite := func(t *testing.T, dir string, change func(*specs.Spec)) {
		var s specs.Spec
		b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		change(&s)
		b, _ = json.Marshal(&s)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir = write(t, ok...)
	rewrite(t, dir, func(s *specs.Spec) {
		s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/sh", Args: []string{"sh", "-c", "id"}}}}
	})
	if err := d.adoptMemImage(dir, to); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a prestart hook: got %v, want InvalidArgument", err)
	}
	dir = write(t, ok...)
	rewrite(t, dir, func(s *specs.Spec) { runsc.AsTenant(s, "sb-of-another-tenant") })
	if err := d.adoptMemImage(dir, to); err != nil {
		t.Fatalf("adopt a tenant's: %v", err)
	}
	rewrite(t, dir, func(s *specs.Spec) {
		if len(s.Annotations) != 0 {
			t.Errorf("the sender's pod annotations are kept: %v", s.Annotations)
		}
	})
}

// TestCommitRefusesAnotherImage: a received record names the image its
// sender says; the ledger records it only when that is the image the
// pull ensured (an image only this node holds, named by a sender, would
// reach the sender through its checkpoint's children).
func TestCommitRefusesAnotherImage(t *testing.T) {
	l := transferLedger{&Daemon{}}
	ensured, private := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	rec := func(digest string) []byte {
		b, _ := json.Marshal(transferRecord{Checkpoint: store.Checkpoint{ID: "ck-1", SandboxID: "sb-1", Kind: KindFilesystem,
			Image: "example.com/private:1", ImageDigest: digest}})
		return b
	}
	for name, tc := range map[string]struct{ rec, ensured string }{
		"another image":       {private, ensured},
		"no image":            {"", ensured},
		"nothing ensured":     {private, ""},
		"nothing on any side": {"", ""},
	} {
		t.Run(name, func(t *testing.T) {
			err := l.Commit(context.Background(), "ck-1", rec(tc.rec), "", tc.ensured)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "ensured") {
				t.Fatalf("got %v, want InvalidArgument naming the image ensured", err)
			}
		})
	}
}

// TestCommitRefusesLocalSource: a received checkpoint whose source is a
// sandbox of this node (by its ID) is refused: the memory image's bundle
// paths, and its agent token, would be taken from that sandbox's.
func TestCommitRefusesLocalSource(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateSandbox(ctx, &store.Sandbox{ID: "sb-local", Name: "victim", State: store.StateRunning, Image: "img", Runtime: RuntimeCrun}); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{store: st, runtimes: map[string]runtime.Runtime{RuntimeCrun: nil}}
	digest := "sha256:" + strings.Repeat("a", 64)
	rec, _ := json.Marshal(transferRecord{Checkpoint: store.Checkpoint{ID: "ck-1", SandboxID: "sb-local", Kind: KindFilesystem,
		Runtime: RuntimeCrun, Image: "img", ImageDigest: digest}})
	err = transferLedger{d}.Commit(ctx, "ck-1", rec, "", digest)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "a sandbox of this node") {
		t.Fatalf("got %v, want InvalidArgument naming the local sandbox", err)
	}
}
