// Package env owns environments: "prepare once, fork per run". A
// definition (image, resources, setup steps) is hashed; the first request
// builds it (a builder sandbox runs the steps, each checkpointed as it
// completes) and later ones start sandboxes from that warm snapshot, from a
// warm pool when one is configured. A definition that only appends steps
// starts from the longest prefix already built; concurrent requests for one
// hash share one build (or one client-held build lease); a snapshot older
// than its max age is rebuilt in the background while it keeps serving.
//
// The package keeps the environments' records and events in the store and
// reaches sandboxes only through the small Sandboxes interface, which the
// sandbox manager (package daemon) implements. Every goroutine it starts
// (pool refills, background rebuilds, builds shared by several callers,
// lease timers) runs under the Manager's context, which Close cancels
// before it waits for them.
package env

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// SetupStep is one step of an environment's setup: a shell command, or a
// file to write.
type SetupStep struct {
	Run          string `json:"run,omitempty"`
	WritePath    string `json:"write_path,omitempty"`
	WriteContent []byte `json:"write_content,omitempty"`
	WriteMode    uint32 `json:"write_mode,omitempty"`
}

// Definition is an environment's declarative definition.
type Definition struct {
	Name   string `json:"name"`
	Image  string `json:"image"`
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
	Pids   int64  `json:"pids,omitempty"`
	// Disk is the disk limit of the builder and of every sandbox of the
	// environment ("2Gi"; "0" = none; "" = the daemon's default).
	Disk    string            `json:"disk,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	Egress  string            `json:"egress,omitempty"`
	Runtime string            `json:"runtime,omitempty"`
	Steps   []SetupStep       `json:"steps,omitempty"`
	// Start, when set, leaves processes running after the steps: the
	// snapshot is then a memory checkpoint (see start.go).
	Start     *StartCommand `json:"start,omitempty"`
	MaxAge    time.Duration `json:"max_age,omitempty"`
	PoolSize  int           `json:"pool_size,omitempty"`
	SetupHash string        `json:"setup_hash,omitempty"`
}

// Status is an environment as the API shows it.
type Status struct {
	Def       Definition
	Rec       *store.Environment
	PoolReady int
}

// Progress is one build progress event.
type Progress struct {
	Phase    string
	Step     int
	Steps    int
	Message  string
	Output   []byte
	ExitCode int
}

// Overrides replace what a handed-over sandbox inherits from the
// environment's snapshot; zero fields are inherited.
type Overrides struct {
	CPU, Memory string
	Pids        int64
	Disk        string
	Env         map[string]string
	Cwd         string
	Egress      string
	Name        string
}

func (o Overrides) empty() bool {
	return o.CPU == "" && o.Memory == "" && o.Pids == 0 && o.Disk == "" && len(o.Env) == 0 && o.Cwd == "" && o.Egress == "" && o.Name == ""
}

// Sandboxes is what environments need from the sandbox manager.
type Sandboxes interface {
	// Validate checks a definition's image, resources, env and runtime as
	// a create would, fills in the default runtime, and returns the
	// image's digest.
	Validate(ctx context.Context, def *Definition) (digest string, err error)
	// StartBuilder starts a builder sandbox for def (a validated
	// definition of the given hash), from the checkpoint from when it is
	// not "" (a built prefix of its steps).
	StartBuilder(ctx context.Context, def Definition, hash, from string) (*store.Sandbox, error)
	// StartFromCheckpoint starts a sandbox from a checkpoint with the
	// overrides; pool, when not "", is the environment whose warm pool it
	// joins; event is extra data for its sandbox.created event.
	StartFromCheckpoint(ctx context.Context, checkpoint string, o Overrides, pool string, event map[string]any) (*store.Sandbox, error)
	// Exec runs a shell command in a sandbox and returns its exit code.
	Exec(ctx context.Context, sandbox, shell string, stdout, stderr io.Writer) (int, error)
	// WriteFile writes a file in a sandbox.
	WriteFile(ctx context.Context, sandbox, path string, data []byte, mode uint32) error
	// Checkpoint captures a sandbox and returns the checkpoint's ID.
	Checkpoint(ctx context.Context, sandbox, tag string) (string, error)
	// Start runs a shell command in the background in a sandbox.
	Start(ctx context.Context, sandbox, shell string) (int, error)
	// Probe runs a shell command, bounded by timeout, and returns its exit
	// code (its output is discarded).
	Probe(ctx context.Context, sandbox, shell string, timeout time.Duration) (int, error)
	// ReadFile reads a file in a sandbox.
	ReadFile(ctx context.Context, sandbox, path string) ([]byte, error)
	// CheckpointMemory captures a disposable sandbox's memory, processes
	// and filesystem and returns the checkpoint's ID; the sandbox is
	// closed by it.
	CheckpointMemory(ctx context.Context, sandbox, tag string) (string, error)
	// DeleteCheckpoint deletes a checkpoint and its snapshot.
	DeleteCheckpoint(ctx context.Context, checkpoint string) error
	// Delete closes a sandbox.
	Delete(ctx context.Context, sandbox string) error
}

const (
	maxPoolSize = 32
	// maxSteps and maxDefinitionBytes bound a definition given by an API
	// caller (it is stored, hashed and replayed by every build).
	maxSteps           = 256
	maxDefinitionBytes = 8 << 20
	// leaseTimeout bounds how long a client may hold a build.
	leaseTimeout = 2 * time.Hour
)

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// errClosed is returned to callers whose work the Manager's Close stopped.
var errClosed = fmt.Errorf("the environment manager is closing: %w", errdefs.ErrUnavailable)

// Manager runs environments. Its zero value is not usable: use New.
type Manager struct {
	sb    Sandboxes
	store *store.Store
	log   *slog.Logger

	ctx    context.Context // cancelled by Close; every goroutine runs under it
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// builds holds one build or build lease per definition hash; other
	// callers of that hash share its result.
	builds singleflight.Group

	mu       sync.Mutex
	closed   bool
	building map[string]bool          // hashes with a build or lease in flight (for progress only)
	leases   map[string]*lease        // by lease ID
	filling  map[string]chan struct{} // pool refills in flight by env name, closed when one ends
	rebuilt  map[string]time.Time     // last scheduled rebuild, by env name
}

// New returns a manager that reaches sandboxes through sb and keeps
// records in st. Its goroutines live until Close; ctx's values (not its
// cancellation) are passed on to them.
func New(ctx context.Context, sb Sandboxes, st *store.Store, log *slog.Logger) *Manager {
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{sb: sb, store: st, log: log, building: map[string]bool{}, leases: map[string]*lease{},
		filling: map[string]chan struct{}{}, rebuilt: map[string]time.Time{}}
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return m
}

// Close stops the manager's goroutines (builds in flight fail and are
// recorded so; the builders of leases are closed) and waits for them.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	return nil
}

// enter registers the calling goroutine as one Close waits for; it returns
// false once Close has begun. The caller calls m.wg.Done when it ends.
func (m *Manager) enter() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	return true
}

// spawn runs f in a goroutine that Close cancels and waits for.
func (m *Manager) spawn(f func(ctx context.Context)) bool {
	if !m.enter() {
		return false
	}
	go func() {
		defer m.wg.Done()
		f(m.ctx)
	}()
	return true
}

// hashPrefix is the hash of the definition with its first n steps: what
// the snapshot after step n is keyed by. Name, max age and pool size are
// not part of it (they do not change what is built).
func (def *Definition) hashPrefix(digest string, n int) string {
	return def.hashOf(digest, n, false)
}

// hashOf is hashPrefix, with the start command too when start is set.
func (def *Definition) hashOf(digest string, n int, start bool) string {
	keys := make([]string, 0, len(def.Env))
	for k := range def.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var env []string
	for _, k := range keys {
		env = append(env, k+"="+def.Env[k])
	}
	h := map[string]any{
		"v": 1, "digest": digest, "runtime": def.Runtime, "cpu": def.CPU, "memory": def.Memory, "pids": def.Pids,
		"env": env, "cwd": def.Cwd, "egress": def.Egress, "setup_hash": def.SetupHash, "steps": def.Steps[:n],
	}
	if def.Disk != "" {
		// Only when set, so that the hashes of environments built before
		// disk limits were part of definitions stay the same.
		h["disk"] = def.Disk
	}
	if start {
		h["start"] = def.Start
	}
	b, _ := json.Marshal(h)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// hash is the hash of the whole definition: its snapshot's key. With a
// start command it differs from the hash of all its steps (the filesystem
// snapshot the start command runs on).
func (def *Definition) hash(digest string) string {
	return def.hashOf(digest, len(def.Steps), def.Start != nil)
}

// check validates a definition and returns its image's digest.
func (m *Manager) check(ctx context.Context, def *Definition) (string, error) {
	if !nameRE.MatchString(def.Name) {
		return "", fmt.Errorf("environment name %q: use 1-63 letters, digits, '_', '.' or '-': %w", def.Name, errdefs.ErrInvalidArgument)
	}
	if def.PoolSize < 0 || def.PoolSize > maxPoolSize {
		return "", fmt.Errorf("pool size %d: want 0 to %d: %w", def.PoolSize, maxPoolSize, errdefs.ErrInvalidArgument)
	}
	if def.MaxAge < 0 {
		return "", fmt.Errorf("max age %s is negative: %w", def.MaxAge, errdefs.ErrInvalidArgument)
	}
	if len(def.Steps) > maxSteps {
		return "", fmt.Errorf("%d setup steps, more than %d: %w", len(def.Steps), maxSteps, errdefs.ErrResourceExhausted)
	}
	size := 0
	for i, st := range def.Steps {
		if (st.Run == "") == (st.WritePath == "") {
			return "", fmt.Errorf("step %d: give a command (run) or a file (write_path), one of them: %w", i+1, errdefs.ErrInvalidArgument)
		}
		size += len(st.Run) + len(st.WritePath) + len(st.WriteContent)
	}
	if size > maxDefinitionBytes {
		return "", fmt.Errorf("setup steps are %d bytes, more than %d: %w", size, maxDefinitionBytes, errdefs.ErrResourceExhausted)
	}
	if err := checkStart(def.Start); err != nil {
		return "", err
	}
	return m.sb.Validate(ctx, def)
}

// define records a definition (replacing an older one of that name) and
// returns its record, whose Hash is the definition's full hash.
func (m *Manager) define(ctx context.Context, def *Definition) (*store.Environment, error) {
	digest, err := m.check(ctx, def)
	if err != nil {
		return nil, err
	}
	hash := def.hash(digest)
	js, _ := json.Marshal(def)
	rec, err := m.store.GetEnvironment(ctx, def.Name)
	if errdefs.IsNotFound(err) {
		rec = &store.Environment{Name: def.Name, State: store.EnvNew}
	} else if err != nil {
		return nil, err
	}
	if rec.Hash != hash || rec.Definition != string(js) {
		if rec.Hash != hash {
			// A new definition: until it is built, the record points at the
			// snapshot of this hash if one exists (an earlier build).
			ck, at, err := m.store.EnvSnapshot(ctx, hash)
			if err != nil {
				return nil, err
			}
			if ck != "" && !m.checkpointExists(ctx, ck) {
				ck = ""
			}
			rec.Checkpoint, rec.BuiltAt, rec.State = ck, at, store.EnvNew
			if ck != "" {
				rec.State = store.EnvReady
			}
		}
		rec.Hash, rec.Definition = hash, string(js)
		if err := m.store.PutEnvironment(ctx, rec); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

// event records an environment event in the ledger, under "env:<name>".
func (m *Manager) event(ctx context.Context, name, typ string, data map[string]any) {
	m.store.AppendEvent(ctx, "env:"+name, typ, data)
}

// checkpointExists reports whether a checkpoint is still there (it may
// have been deleted under an environment that points at it: then the
// environment is built again).
func (m *Manager) checkpointExists(ctx context.Context, id string) bool {
	_, err := m.store.GetCheckpoint(ctx, id)
	return err == nil
}

// DefinitionOf returns the definition an environment record holds.
func DefinitionOf(rec *store.Environment) Definition {
	var def Definition
	_ = json.Unmarshal([]byte(rec.Definition), &def)
	return def
}

// Get returns an environment.
func (m *Manager) Get(ctx context.Context, name string) (*Status, error) {
	rec, err := m.store.GetEnvironment(ctx, name)
	if err != nil {
		return nil, err
	}
	return m.status(ctx, rec)
}

func (m *Manager) status(ctx context.Context, rec *store.Environment) (*Status, error) {
	pooled, err := m.store.Pooled(ctx, rec.Name)
	if err != nil {
		return nil, err
	}
	n := 0
	for _, sb := range pooled {
		if sb.FromCheckpoint == rec.Checkpoint && sb.State == store.StateRunning {
			n++
		}
	}
	return &Status{Def: DefinitionOf(rec), Rec: rec, PoolReady: n}, nil
}

// List lists environments.
func (m *Manager) List(ctx context.Context) ([]*Status, error) {
	recs, err := m.store.ListEnvironments(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Status
	for _, r := range recs {
		st, err := m.status(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// Delete deletes an environment, its pool and its snapshots. Sandboxes
// handed over from it are not affected.
func (m *Manager) Delete(ctx context.Context, name string) error {
	cks, err := m.store.DeleteEnvironment(ctx, name)
	if err != nil {
		return err
	}
	// A refill in flight sees the record gone and stops; then the pool is
	// closed.
	m.mu.Lock()
	filling := m.filling[name]
	m.mu.Unlock()
	if filling != nil {
		select {
		case <-filling:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	pooled, err := m.store.Pooled(ctx, name)
	if err != nil {
		return err
	}
	for _, sb := range pooled {
		if claimed, err := m.store.ClaimFromPool(ctx, sb.ID, name); err != nil || !claimed {
			continue // handed over meanwhile: it is its user's now
		}
		if err := m.sb.Delete(ctx, sb.ID); err != nil {
			m.log.Warn("close pooled sandbox", "sandbox", sb.ID, "err", err)
		}
	}
	m.log.Info("environment deleted", "environment", name, "pooled_closed", len(pooled), "snapshots", len(cks))
	var errs []error
	for _, ck := range cks {
		// Another environment with the same definition may use it.
		if used, err := m.store.IsEnvSnapshot(ctx, ck); err != nil || used {
			continue
		}
		if err := m.sb.DeleteCheckpoint(ctx, ck); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	m.event(ctx, name, "env.deleted", nil)
	return errors.Join(errs...)
}

func stepLabel(st SetupStep) string {
	if st.Run != "" {
		return st.Run
	}
	return "write " + st.WritePath
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }
