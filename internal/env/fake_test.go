package env

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// fakeSandboxes is a sandbox manager without sandboxes: records in a real
// store, commands that only record what they were asked, and hooks that
// let a test hold an operation until it says so.
type fakeSandboxes struct {
	st *store.Store

	// onExec, when set, runs a setup command (it may block on ctx or a
	// gate); the default exits 0, or N for "exit N".
	onExec func(ctx context.Context, shell string) (int, error)
	// onBuilder, when set, runs at the start of StartBuilder.
	onBuilder func(ctx context.Context) error
	// onStart, when set, runs at the start of StartFromCheckpoint.
	onStart func(ctx context.Context, pool string) error
	// started, when set, is sent the pool of each sandbox started from a
	// checkpoint, once it is recorded; closed, the ID of each closed one.
	started chan string
	closed  chan string
	// procNet, when set, is what the sandboxes' /proc/net/tcp holds (it is
	// read under mu; a test may change it).
	procNet []byte

	mu       sync.Mutex
	n        int
	builders []string // "from" of each builder started
	execs    []string
	writes   []string
	deleted  []string
}

func newFake(t *testing.T) (*fakeSandboxes, *Manager) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSandboxes{st: st}
	m := New(context.Background(), f, st, nil)
	t.Cleanup(func() {
		m.Close()
		st.Close()
	})
	return f, m
}

func (f *fakeSandboxes) next(prefix string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return fmt.Sprintf("%s%d", prefix, f.n)
}

func (f *fakeSandboxes) Validate(ctx context.Context, def *Definition) (string, error) {
	if def.Image == "" {
		return "", fmt.Errorf("an image is required: %w", errdefs.ErrInvalidArgument)
	}
	if def.Image == "missing" {
		return "", fmt.Errorf("image missing: %w", errdefs.ErrNotFound)
	}
	if def.Runtime == "" {
		def.Runtime = "fake"
	}
	return "sha256:" + def.Image, nil
}

func (f *fakeSandboxes) create(ctx context.Context, name, from, pool string) (*store.Sandbox, error) {
	sb := &store.Sandbox{ID: f.next("sb-"), Name: name, State: store.StateRunning, Runtime: "fake", FromCheckpoint: from, Pool: pool}
	if err := f.st.CreateSandbox(ctx, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

func (f *fakeSandboxes) StartBuilder(ctx context.Context, def Definition, hash, from string) (*store.Sandbox, error) {
	if f.onBuilder != nil {
		if err := f.onBuilder(ctx); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	f.builders = append(f.builders, from)
	f.mu.Unlock()
	return f.create(ctx, "build-"+def.Name+"-"+randomHex(3), from, "")
}

func (f *fakeSandboxes) StartFromCheckpoint(ctx context.Context, checkpoint string, o Overrides, pool string, event map[string]any) (*store.Sandbox, error) {
	if f.onStart != nil {
		if err := f.onStart(ctx, pool); err != nil {
			return nil, err
		}
	}
	if _, err := f.st.GetCheckpoint(ctx, checkpoint); err != nil {
		return nil, err
	}
	sb, err := f.create(ctx, o.Name, checkpoint, pool)
	if err == nil && f.started != nil {
		f.started <- pool
	}
	return sb, err
}

func (f *fakeSandboxes) Exec(ctx context.Context, sandbox, shell string, stdout, stderr io.Writer) (int, error) {
	f.mu.Lock()
	f.execs = append(f.execs, shell)
	f.mu.Unlock()
	io.WriteString(stdout, "ran "+shell+"\n")
	if f.onExec != nil {
		return f.onExec(ctx, shell)
	}
	var code int
	if _, err := fmt.Sscanf(shell, "exit %d", &code); err == nil {
		return code, nil
	}
	return 0, nil
}

func (f *fakeSandboxes) WriteFile(ctx context.Context, sandbox, path string, data []byte, mode uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, path+"="+string(data))
	return nil
}

func (f *fakeSandboxes) Checkpoint(ctx context.Context, sandbox, tag string) (string, error) {
	ck := &store.Checkpoint{ID: f.next("ck-"), SandboxID: sandbox, Tag: tag, Kind: "filesystem", Runtime: "fake"}
	return ck.ID, f.st.AddCheckpoint(ctx, ck)
}

func (f *fakeSandboxes) Start(ctx context.Context, sandbox, shell string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execs = append(f.execs, "start:"+shell)
	return 42, nil
}

func (f *fakeSandboxes) Probe(ctx context.Context, sandbox, shell string, timeout time.Duration) (int, error) {
	return f.Exec(ctx, sandbox, shell, io.Discard, io.Discard)
}

func (f *fakeSandboxes) ReadFile(ctx context.Context, sandbox, path string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if path != "/proc/net/tcp" || f.procNet == nil {
		return nil, fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
	}
	return append([]byte(nil), f.procNet...), nil
}

func (f *fakeSandboxes) setProcNet(b string) {
	f.mu.Lock()
	f.procNet = []byte(b)
	f.mu.Unlock()
}

func (f *fakeSandboxes) CheckpointMemory(ctx context.Context, sandbox, tag string) (string, error) {
	ck := &store.Checkpoint{ID: f.next("ck-"), SandboxID: sandbox, Tag: tag, Kind: "filesystem+memory", Runtime: "fake"}
	if err := f.st.AddCheckpoint(ctx, ck); err != nil {
		return "", err
	}
	return ck.ID, f.Delete(ctx, sandbox)
}

func (f *fakeSandboxes) DeleteCheckpoint(ctx context.Context, checkpoint string) error {
	return f.st.DeleteCheckpoint(ctx, checkpoint)
}

func (f *fakeSandboxes) Delete(ctx context.Context, sandbox string) error {
	f.mu.Lock()
	f.deleted = append(f.deleted, sandbox)
	f.mu.Unlock()
	err := f.st.SwapSandboxState(context.WithoutCancel(ctx), sandbox, store.StateRunning, store.StateClosed, "")
	if f.closed != nil {
		f.closed <- sandbox
	}
	return err
}

func (f *fakeSandboxes) count(list *[]string, prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range *list {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// liveNames returns the names of the live sandboxes.
func (f *fakeSandboxes) live(t *testing.T) []*store.Sandbox {
	t.Helper()
	sbs, err := f.st.ListSandboxes(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	return sbs
}

func def(name string, steps ...string) Definition {
	d := Definition{Name: name, Image: "busybox"}
	for _, s := range steps {
		d.Steps = append(d.Steps, SetupStep{Run: s})
	}
	return d
}
