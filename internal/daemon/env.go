package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// Environments: "prepare once, fork per run". A definition (image, resources,
// setup steps) is hashed; the first request builds it (create, run the
// steps, checkpoint) and later ones fork from that warm snapshot. Every step
// is checkpointed as it completes, keyed by the hash of the definition up to
// that step, so a definition that only appends steps starts from the longest
// prefix already built. Concurrent requests for one hash wait for one build.

// SetupStep is one step of an environment's setup: a shell command, or a
// file to write.
type SetupStep struct {
	Run          string `json:"run,omitempty"`
	WritePath    string `json:"write_path,omitempty"`
	WriteContent []byte `json:"write_content,omitempty"`
	WriteMode    uint32 `json:"write_mode,omitempty"`
}

// EnvDefinition is an environment's declarative definition.
type EnvDefinition struct {
	Name      string            `json:"name"`
	Image     string            `json:"image"`
	CPU       string            `json:"cpu,omitempty"`
	Memory    string            `json:"memory,omitempty"`
	Pids      int64             `json:"pids,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Egress    string            `json:"egress,omitempty"`
	Runtime   string            `json:"runtime,omitempty"`
	Steps     []SetupStep       `json:"steps,omitempty"`
	MaxAge    time.Duration     `json:"max_age,omitempty"`
	PoolSize  int               `json:"pool_size,omitempty"`
	SetupHash string            `json:"setup_hash,omitempty"`
}

const maxPoolSize = 32

// hashPrefix is the hash of the definition with its first n steps: what
// the snapshot after step n is keyed by. Name, max age and pool size are
// not part of it (they do not change what is built).
func (def *EnvDefinition) hashPrefix(digest string, n int) string {
	keys := make([]string, 0, len(def.Env))
	for k := range def.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var env []string
	for _, k := range keys {
		env = append(env, k+"="+def.Env[k])
	}
	b, _ := json.Marshal(map[string]any{
		"v": 1, "digest": digest, "runtime": def.Runtime, "cpu": def.CPU, "memory": def.Memory, "pids": def.Pids,
		"env": env, "cwd": def.Cwd, "egress": def.Egress, "setup_hash": def.SetupHash, "steps": def.Steps[:n],
	})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// EnvStatus is an environment as the API shows it.
type EnvStatus struct {
	Def       EnvDefinition
	Rec       *store.Environment
	PoolReady int
}

// EnvProgress is one build progress event.
type EnvProgress struct {
	Phase    string
	Step     int
	Steps    int
	Message  string
	Output   []byte
	ExitCode int
}

// buildCall is one build of a hash in flight; waiters share its result.
type buildCall struct {
	done chan struct{}
	ck   string
	err  error
}

// envState is the daemon's in-memory environment state.
type envState struct {
	mu      sync.Mutex
	builds  map[string]*buildCall // by full hash
	leases  map[string]*lease
	filling map[string]bool      // pools being refilled, by env name
	rebuilt map[string]time.Time // last scheduled rebuild, by env name
}

func (d *Daemon) envs() *envState {
	d.envOnce.Do(func() {
		d.envSt = &envState{builds: map[string]*buildCall{}, leases: map[string]*lease{}, filling: map[string]bool{},
			rebuilt: map[string]time.Time{}}
	})
	return d.envSt
}

func (d *Daemon) checkEnvDefinition(ctx context.Context, def *EnvDefinition) (string, error) {
	if !nameRE.MatchString(def.Name) {
		return "", fmt.Errorf("environment name %q: use 1-63 letters, digits, '_', '.' or '-': %w", def.Name, errdefs.ErrInvalidArgument)
	}
	if def.PoolSize < 0 || def.PoolSize > maxPoolSize {
		return "", fmt.Errorf("pool size %d: want 0 to %d: %w", def.PoolSize, maxPoolSize, errdefs.ErrInvalidArgument)
	}
	if def.MaxAge < 0 {
		return "", fmt.Errorf("max age %s is negative: %w", def.MaxAge, errdefs.ErrInvalidArgument)
	}
	for i, st := range def.Steps {
		if (st.Run == "") == (st.WritePath == "") {
			return "", fmt.Errorf("step %d: give a command (run) or a file (write_path), one of them: %w", i+1, errdefs.ErrInvalidArgument)
		}
	}
	o := CreateOptions{Image: def.Image, Name: def.Name, CPU: def.CPU, Memory: def.Memory, Pids: def.Pids, Env: def.Env,
		Cwd: def.Cwd, Egress: def.Egress, Runtime: def.Runtime}
	_, img, err := d.validate(ctx, &o)
	if err != nil {
		return "", err
	}
	def.Runtime = o.Runtime
	return img.Digest, nil
}

// defineEnv records a definition (replacing an older one of that name) and
// returns the record and the full hash.
func (d *Daemon) defineEnv(ctx context.Context, def *EnvDefinition) (*store.Environment, error) {
	digest, err := d.checkEnvDefinition(ctx, def)
	if err != nil {
		return nil, err
	}
	hash := def.hashPrefix(digest, len(def.Steps))
	js, _ := json.Marshal(def)
	rec, err := d.store.GetEnvironment(ctx, def.Name)
	if errdefs.IsNotFound(err) {
		rec = &store.Environment{Name: def.Name, State: store.EnvNew}
	} else if err != nil {
		return nil, err
	}
	if rec.Hash != hash || rec.Definition != string(js) {
		if rec.Hash != hash {
			// A new definition: until it is built, the record points at the
			// snapshot of this hash if one exists (an earlier build).
			ck, at, err := d.store.EnvSnapshot(ctx, hash)
			if err != nil {
				return nil, err
			}
			if ck != "" && !d.checkpointExists(ctx, ck) {
				ck = ""
			}
			rec.Checkpoint, rec.BuiltAt, rec.State = ck, at, store.EnvNew
			if ck != "" {
				rec.State = store.EnvReady
			}
		}
		rec.Hash, rec.Definition = hash, string(js)
		if err := d.store.PutEnvironment(ctx, rec); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

// envEvent records an environment event in the ledger, under "env:<name>".
func (d *Daemon) envEvent(ctx context.Context, name, typ string, data map[string]any) {
	d.store.AppendEvent(context.WithoutCancel(ctx), "env:"+name, typ, data)
}

// EnvDefinitionOf returns the definition an environment record holds.
func EnvDefinitionOf(rec *store.Environment) EnvDefinition {
	var def EnvDefinition
	_ = json.Unmarshal([]byte(rec.Definition), &def)
	return def
}

// GetEnvironment returns an environment.
func (d *Daemon) GetEnvironment(ctx context.Context, name string) (*EnvStatus, error) {
	rec, err := d.store.GetEnvironment(ctx, name)
	if err != nil {
		return nil, err
	}
	return d.envStatus(ctx, rec)
}

func (d *Daemon) envStatus(ctx context.Context, rec *store.Environment) (*EnvStatus, error) {
	pooled, err := d.store.Pooled(ctx, rec.Name)
	if err != nil {
		return nil, err
	}
	n := 0
	for _, sb := range pooled {
		if sb.FromCheckpoint == rec.Checkpoint && sb.State == store.StateRunning {
			n++
		}
	}
	return &EnvStatus{Def: EnvDefinitionOf(rec), Rec: rec, PoolReady: n}, nil
}

// ListEnvironments lists environments.
func (d *Daemon) ListEnvironments(ctx context.Context) ([]*EnvStatus, error) {
	recs, err := d.store.ListEnvironments(ctx)
	if err != nil {
		return nil, err
	}
	var out []*EnvStatus
	for _, r := range recs {
		st, err := d.envStatus(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// DeleteEnvironment deletes an environment, its pool and its snapshots.
// Sandboxes handed over from it are not affected.
func (d *Daemon) DeleteEnvironment(ctx context.Context, name string) error {
	cks, err := d.store.DeleteEnvironment(ctx, name)
	if err != nil {
		return err
	}
	// A refill in flight sees the record gone and stops; then the pool is
	// closed.
	es := d.envs()
	for i := 0; i < 600; i++ {
		es.mu.Lock()
		busy := es.filling[name]
		es.mu.Unlock()
		if !busy {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	pooled, err := d.store.Pooled(ctx, name)
	if err != nil {
		return err
	}
	for _, sb := range pooled {
		if claimed, err := d.store.ClaimFromPool(ctx, sb.ID, name); err != nil || !claimed {
			continue // handed over meanwhile: it is its user's now
		}
		if err := d.Delete(ctx, sb.ID); err != nil {
			d.log.Warn("close pooled sandbox", "sandbox", sb.ID, "err", err)
		}
	}
	d.log.Info("environment deleted", "environment", name, "pooled_closed", len(pooled), "snapshots", len(cks))
	for _, ck := range cks {
		// Another environment with the same definition may use it.
		if used, err := d.store.IsEnvSnapshot(ctx, ck); err != nil || used {
			continue
		}
		if err := d.deleteCheckpoint(ctx, ck); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	d.envEvent(ctx, name, "env.deleted", nil)
	return nil
}

func stepLabel(st SetupStep) string {
	if st.Run != "" {
		return st.Run
	}
	return "write " + st.WritePath
}

func tailBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
