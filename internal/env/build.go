package env

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// Build defines an environment and builds it unless its hash is built
// already. Concurrent callers of one hash share one build; the build goes
// on if its caller goes away (others may be waiting), until Close. With
// force, the steps run again from the image (a scheduled rebuild). It
// reports whether this call ran the build.
func (m *Manager) Build(ctx context.Context, def Definition, force bool, progress func(Progress)) (*Status, bool, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	rec, err := m.define(ctx, &def)
	if err != nil {
		return nil, false, err
	}
	if rec.State == store.EnvReady && rec.Checkpoint != "" && !force && m.checkpointExists(ctx, rec.Checkpoint) {
		progress(Progress{Phase: "cached", Steps: len(def.Steps), Message: "already built: " + rec.Checkpoint})
		st, err := m.status(ctx, rec)
		return st, false, err
	}
	built, err := m.buildOnce(ctx, def, rec.Hash, force, progress)
	if err != nil {
		return nil, false, err
	}
	if rec, err = m.store.GetEnvironment(ctx, def.Name); err != nil {
		return nil, false, err
	}
	st, err := m.status(ctx, rec)
	return st, built, err
}

// buildOnce runs the build of hash, or waits for the build or lease in
// flight. It reports whether this call ran it.
func (m *Manager) buildOnce(ctx context.Context, def Definition, hash string, force bool, progress func(Progress)) (bool, error) {
	// The build reports to this caller only while it is here.
	sink := &progressSink{f: progress}
	defer sink.detach()
	m.mu.Lock()
	if m.building[hash] {
		progress(Progress{Phase: "wait", Message: "another caller is building this definition"})
	}
	m.mu.Unlock()
	ran := false
	ch := m.builds.DoChan(hash, func() (any, error) {
		if !m.enter() {
			return nil, errClosed
		}
		defer m.wg.Done()
		m.setBuilding(hash, true)
		defer m.setBuilding(hash, false)
		if !force && m.built(m.ctx, def.Name, hash) {
			return nil, nil // a build that ended a moment ago made it
		}
		ran = true
		_, err := m.build(m.ctx, def, hash, force, sink.send)
		return nil, err
	})
	select {
	case r := <-ch:
		return ran, r.Err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// built reports whether the environment is ready with the snapshot of hash.
func (m *Manager) built(ctx context.Context, name, hash string) bool {
	rec, err := m.store.GetEnvironment(ctx, name)
	return err == nil && rec.Hash == hash && rec.State == store.EnvReady && rec.Checkpoint != "" && m.checkpointExists(ctx, rec.Checkpoint)
}

func (m *Manager) setBuilding(hash string, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if on {
		m.building[hash] = true
	} else {
		delete(m.building, hash)
	}
}

// build runs a definition's steps in a builder sandbox, checkpointing after
// each, and records the environment ready. A failed step fails the build
// with its output and exit code; the builder is closed either way, and
// only snapshots of complete prefixes are kept.
func (m *Manager) build(ctx context.Context, def Definition, hash string, force bool, progress func(Progress)) (_ string, err error) {
	start := time.Now()
	rec, err := m.store.GetEnvironment(ctx, def.Name)
	if err != nil {
		return "", err
	}
	prev := *rec
	rec.State, rec.Error = store.EnvBuilding, ""
	if err := m.store.PutEnvironment(ctx, rec); err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			// The old snapshot (if any) keeps serving. The record is left
			// alone if it changed meanwhile (redefined or deleted). A build
			// stopped by Close is recorded too.
			ctx := context.WithoutCancel(ctx)
			if cur, gerr := m.store.GetEnvironment(ctx, def.Name); gerr == nil && cur.Hash == prev.Hash {
				cur.State, cur.Error = store.EnvFailed, err.Error()
				if cur.Checkpoint != "" && m.checkpointExists(ctx, cur.Checkpoint) {
					cur.State = store.EnvReady
				}
				m.store.PutEnvironment(ctx, cur)
			}
			m.event(ctx, def.Name, "env.build_failed", map[string]any{"hash": hash, "error": err.Error()})
		}
	}()
	digest, err := m.sb.Validate(ctx, &def)
	if err != nil {
		return "", err
	}
	// The longest prefix of the steps already built.
	from, fromCk := 0, ""
	if !force {
		// With a start command, the snapshot of all the steps is a prefix
		// too (the start command runs on it).
		top := len(def.Steps) - 1
		if def.Start != nil {
			top = len(def.Steps)
		}
		for n := top; n >= 1; n-- {
			ck, _, err := m.store.EnvSnapshot(ctx, def.hashPrefix(digest, n))
			if err != nil {
				return "", err
			}
			if ck != "" && m.checkpointExists(ctx, ck) {
				from, fromCk = n, ck
				break
			}
		}
	}
	m.event(ctx, def.Name, "env.build_started", map[string]any{"hash": hash, "steps": len(def.Steps), "cached_steps": from, "force": force})
	if from > 0 {
		progress(Progress{Phase: "cached", Step: from, Steps: len(def.Steps), Message: fmt.Sprintf("steps 1-%d already built (%s)", from, fromCk)})
	}
	progress(Progress{Phase: "create", Steps: len(def.Steps), Message: "starting the builder sandbox"})
	builder, err := m.sb.StartBuilder(ctx, def, hash, fromCk)
	if err != nil {
		return "", err
	}
	defer m.sb.Delete(context.WithoutCancel(ctx), builder.ID)
	ck := fromCk
	for i := from; i < len(def.Steps); i++ {
		if ck, err = m.runStep(ctx, def, digest, builder.ID, i, progress); err != nil {
			return "", err
		}
	}
	if def.Start != nil || len(def.Steps) == 0 {
		if ck, err = m.capture(ctx, def, builder.ID, progress); err != nil {
			return "", err
		}
		if err := m.store.PutEnvSnapshot(ctx, hash, def.Name, ck, len(def.Steps)); err != nil {
			return "", err
		}
	}
	return ck, m.finishBuild(ctx, def, hash, ck, from, start, progress)
}

// capture takes the environment's snapshot of a builder whose steps have
// run: a memory checkpoint after the start command when there is one, else
// a filesystem checkpoint.
func (m *Manager) capture(ctx context.Context, def Definition, builder string, progress func(Progress)) (string, error) {
	if def.Start != nil {
		return m.startAndCapture(ctx, def, builder, progress)
	}
	return m.sb.Checkpoint(ctx, builder, "env:"+def.Name)
}

// runStep runs step i in the builder and checkpoints the result.
func (m *Manager) runStep(ctx context.Context, def Definition, digest, builder string, i int, progress func(Progress)) (string, error) {
	st := def.Steps[i]
	n := len(def.Steps)
	progress(Progress{Phase: "step", Step: i + 1, Steps: n, Message: stepLabel(st)})
	t := time.Now()
	if st.WritePath != "" {
		if err := m.sb.WriteFile(ctx, builder, st.WritePath, st.WriteContent, st.WriteMode); err != nil {
			return "", fmt.Errorf("step %d (%s): %w", i+1, stepLabel(st), err)
		}
	} else {
		out := &progressWriter{step: i + 1, steps: n, progress: progress}
		code, err := m.sb.Exec(ctx, builder, st.Run, out, out)
		if err != nil {
			return "", fmt.Errorf("step %d (%s): %w", i+1, st.Run, err)
		}
		progress(Progress{Phase: "step_done", Step: i + 1, Steps: n, ExitCode: code})
		m.event(ctx, def.Name, "env.step", map[string]any{"step": i + 1, "command": st.Run, "exit_code": code,
			"duration_ms": msSince(t)})
		if code != 0 {
			return "", fmt.Errorf("step %d (%s) exited %d; its output ends: %q: %w", i+1, st.Run, code,
				tailBytes(out.buf, 2048), errdefs.ErrFailedPrecondition)
		}
	}
	ck, err := m.sb.Checkpoint(ctx, builder, fmt.Sprintf("env:%s:step-%d", def.Name, i+1))
	if err != nil {
		return "", err
	}
	if err := m.store.PutEnvSnapshot(ctx, def.hashPrefix(digest, i+1), def.Name, ck, i+1); err != nil {
		return "", err
	}
	return ck, nil
}

// finishBuild points the environment at its new snapshot and records it.
func (m *Manager) finishBuild(ctx context.Context, def Definition, hash, ck string, cached int, start time.Time, progress func(Progress)) error {
	rec, err := m.store.GetEnvironment(ctx, def.Name)
	if err != nil {
		return err
	}
	if rec.Hash == hash {
		rec.Checkpoint, rec.BuiltAt, rec.BuildMS, rec.State, rec.Error, rec.CachedSteps = ck, time.Now(), msSince(start), store.EnvReady, "", cached
		if err := m.store.PutEnvironment(ctx, rec); err != nil {
			return err
		}
	}
	m.event(ctx, def.Name, "env.build_finished", map[string]any{"hash": hash, "checkpoint": ck, "build_ms": msSince(start), "cached_steps": cached})
	progress(Progress{Phase: "done", Steps: len(def.Steps), Message: ck})
	m.refillPool(def.Name)
	return nil
}

// progressSink forwards a shared build's progress to the caller that
// started it until that caller returns.
type progressSink struct {
	mu sync.Mutex
	f  func(Progress)
}

func (s *progressSink) send(p Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		s.f(p)
	}
}

func (s *progressSink) detach() {
	s.mu.Lock()
	s.f = nil
	s.mu.Unlock()
}

// progressWriter forwards step output as progress events and keeps its end
// for error messages.
type progressWriter struct {
	step, steps int
	progress    func(Progress)
	buf         []byte
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.progress(Progress{Phase: "output", Step: w.step, Steps: w.steps, Output: append([]byte(nil), p...)})
	w.buf = append(w.buf, p...)
	if len(w.buf) > 64<<10 {
		w.buf = w.buf[len(w.buf)-32<<10:]
	}
	return len(p), nil
}

func tailBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
