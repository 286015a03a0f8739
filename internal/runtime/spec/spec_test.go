// Tests for NewSpec validation and defaults, WriteBundle and WriteEtcFiles.

package spec

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func good() SpecOptions {
	return SpecOptions{Rootfs: "/r", Args: []string{"/bin/sh"}, CgroupsPath: "/forkbox/sb-1"}
}

func TestNewSpecValidation(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*SpecOptions)
		ok   bool
	}{
		{"good", func(*SpecOptions) {}, true},
		{"limits", func(o *SpecOptions) { o.CPU, o.MemoryBytes, o.Pids = 1.5, 512<<20, 100 }, true},
		{"systemd cgroup", func(o *SpecOptions) { o.CgroupsPath = "system.slice:forkbox:sb-1" }, true},
		{"relative rootfs", func(o *SpecOptions) { o.Rootfs = "r" }, false},
		{"no rootfs", func(o *SpecOptions) { o.Rootfs = "" }, false},
		{"no args", func(o *SpecOptions) { o.Args = nil }, false},
		{"relative cwd", func(o *SpecOptions) { o.Cwd = "tmp" }, false},
		{"negative cpu", func(o *SpecOptions) { o.CPU = -1 }, false},
		{"NaN cpu", func(o *SpecOptions) { o.CPU = math.NaN() }, false},
		{"Inf cpu", func(o *SpecOptions) { o.CPU = math.Inf(1) }, false},
		{"tiny cpu", func(o *SpecOptions) { o.CPU = 0.001 }, false},
		{"huge cpu", func(o *SpecOptions) { o.CPU = 5000 }, false},
		{"negative memory", func(o *SpecOptions) { o.MemoryBytes = -1 }, false},
		{"tiny memory", func(o *SpecOptions) { o.MemoryBytes = 1024 }, false},
		{"negative pids", func(o *SpecOptions) { o.Pids = -5 }, false},
		{"bad env", func(o *SpecOptions) { o.Env = []string{"NOEQUALS"} }, false},
		{"relative netns", func(o *SpecOptions) { o.NetNSPath = "netns/x" }, false},
		{"cgroup traversal", func(o *SpecOptions) { o.CgroupsPath = "/forkbox/../x" }, false},
		{"cgroup relative", func(o *SpecOptions) { o.CgroupsPath = "forkbox/x" }, false},
		{"bad hostname", func(o *SpecOptions) { o.Hostname = "a/b" }, false},
		{"relative mount", func(o *SpecOptions) { o.Mounts = []specs.Mount{{Destination: "x"}} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good()
			tt.mod(&o)
			_, err := NewSpec(o)
			if tt.ok && err != nil {
				t.Fatalf("got %v, want nil", err)
			}
			if !tt.ok && !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
		})
	}
}

// TestSetCPU: SetCPU replaces or clears a spec's CPU limit.
func TestSetCPU(t *testing.T) {
	o := good()
	o.CPU = 1.5
	s, err := NewSpec(o)
	if err != nil {
		t.Fatal(err)
	}
	SetCPU(s, 0.25)
	if c := s.Linux.Resources.CPU; *c.Quota != 25000 || *c.Period != CPUPeriod {
		t.Errorf("after SetCPU(0.25): quota %d period %d, want 25000 over %d", *c.Quota, *c.Period, CPUPeriod)
	}
	SetCPU(s, 0)
	if s.Linux.Resources.CPU != nil {
		t.Errorf("after SetCPU(0): %+v, want no CPU limit", s.Linux.Resources.CPU)
	}
	if s.Linux.Resources.Devices == nil {
		t.Error("SetCPU dropped the device rules")
	}
}

func TestNewSpecDefaults(t *testing.T) {
	o := good()
	o.CPU, o.MemoryBytes, o.Pids = 0.5, 64<<20, 100
	o.NetNSPath = "/run/netns/x"
	o.Mounts = []specs.Mount{{Destination: "/.forkbox/agent", Type: "bind", Source: "/a", Options: []string{"rbind", "ro"}}}
	s, err := NewSpec(o)
	if err != nil {
		t.Fatal(err)
	}
	r := s.Linux.Resources
	if got := *r.CPU.Quota; got != 50000 {
		t.Errorf("cpu quota = %d, want 50000", got)
	}
	if got := *r.CPU.Period; got != CPUPeriod {
		t.Errorf("cpu period = %d, want %d", got, CPUPeriod)
	}
	if got := *r.Memory.Limit; got != 64<<20 {
		t.Errorf("memory = %d, want %d", got, 64<<20)
	}
	if got := *r.Pids.Limit; got != 100 {
		t.Errorf("pids = %d, want 100", got)
	}
	if !s.Process.NoNewPrivileges {
		t.Error("noNewPrivileges = false, want true")
	}
	if s.Process.Cwd != "/" || !slices.Contains(s.Process.Env, DefaultPath) {
		t.Errorf("cwd %q env %q: want / and a PATH", s.Process.Cwd, s.Process.Env)
	}
	if slices.Contains(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN") {
		t.Error("CAP_SYS_ADMIN in the default capability set")
	}
	var netns string
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			netns = ns.Path
		}
	}
	if netns != "/run/netns/x" {
		t.Errorf("network namespace path = %q, want /run/netns/x", netns)
	}
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Errorf("masked %q readonly %q: want defaults", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	dests := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		dests[m.Destination] = m
	}
	for _, d := range []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/tmp", "/.forkbox/agent"} {
		if _, ok := dests[d]; !ok {
			t.Errorf("no mount at %s", d)
		}
	}
	if got := dests["/tmp"].Source; got != "/r/tmp" {
		t.Errorf("/tmp bind source = %q, want /r/tmp", got)
	}
	// A caller's own /tmp mount replaces the default bind.
	o.Mounts = []specs.Mount{{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"}}
	s, _ = NewSpec(o)
	n := 0
	for _, m := range s.Mounts {
		if m.Destination == "/tmp" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d mounts at /tmp, want 1", n)
	}
}

func TestWriteBundleAndEtcFiles(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := PrepareRootfs(root); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("rootfs tmp: %v, %v; want a sticky dir", fi, err)
	}
	mounts, err := WriteEtcFiles(dir, EtcFiles{Hostname: "sb-1", Nameservers: []string{"10.0.0.1"}, Hosts: []string{"10.0.0.2 db"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 3 {
		t.Fatalf("got %d mounts, want 3", len(mounts))
	}
	for _, m := range mounts {
		if _, err := os.Stat(m.Source); err != nil {
			t.Errorf("mount source %s: %v", m.Source, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc/resolv.conf")); string(b) != "nameserver 10.0.0.1\n" {
		t.Errorf("resolv.conf = %q", b)
	}
	if _, err := WriteEtcFiles(dir, EtcFiles{Nameservers: []string{"1.1.1.1\nnameserver 2"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad nameserver: got %v, want InvalidArgument", err)
	}

	o := good()
	o.Rootfs = root
	s, err := NewSpec(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteBundle(dir, s); err != nil {
		t.Fatal(err)
	}
	back, err := ReadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	if back.Root.Path != root || back.Linux.CgroupsPath != "/forkbox/sb-1" {
		t.Errorf("read back root %q cgroups %q", back.Root.Path, back.Linux.CgroupsPath)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if filepath.Ext(e.Name()) != "" && e.Name()[0] == '.' {
			t.Errorf("temp file left: %s", e.Name())
		}
	}
	s.Root.Path = "rootfs"
	if err := WriteBundle(dir, s); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative root: got %v, want InvalidArgument", err)
	}
}
