package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// BuildEnvironment defines an environment and builds it unless its hash is
// built already. Concurrent callers of one hash share one build. With
// force, the steps run again from the image (a scheduled rebuild).
func (d *Daemon) BuildEnvironment(ctx context.Context, def EnvDefinition, force bool, progress func(EnvProgress)) (*EnvStatus, bool, error) {
	if progress == nil {
		progress = func(EnvProgress) {}
	}
	rec, err := d.defineEnv(ctx, &def)
	if err != nil {
		return nil, false, err
	}
	if rec.State == store.EnvReady && rec.Checkpoint != "" && !force && d.checkpointExists(ctx, rec.Checkpoint) {
		progress(EnvProgress{Phase: "cached", Steps: len(def.Steps), Message: "already built: " + rec.Checkpoint})
		st, err := d.envStatus(ctx, rec)
		return st, false, err
	}
	built, err := d.buildOnce(ctx, def, rec.Hash, force, progress)
	if err != nil {
		return nil, false, err
	}
	if rec, err = d.store.GetEnvironment(ctx, def.Name); err != nil {
		return nil, false, err
	}
	st, err := d.envStatus(ctx, rec)
	return st, built, err
}

// buildOnce runs the build of hash, or waits for the one in flight. It
// reports whether this call ran it.
func (d *Daemon) buildOnce(ctx context.Context, def EnvDefinition, hash string, force bool, progress func(EnvProgress)) (bool, error) {
	es := d.envs()
	es.mu.Lock()
	if c, ok := es.builds[hash]; ok {
		es.mu.Unlock()
		progress(EnvProgress{Phase: "wait", Message: "another caller is building this definition"})
		select {
		case <-c.done:
			return false, c.err
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	c := &buildCall{done: make(chan struct{})}
	es.builds[hash] = c
	es.mu.Unlock()
	defer func() {
		es.mu.Lock()
		delete(es.builds, hash)
		es.mu.Unlock()
		close(c.done)
	}()
	// The build outlives a caller that goes away: others may be waiting.
	c.ck, c.err = d.build(context.WithoutCancel(ctx), def, hash, force, progress)
	return true, c.err
}

// build runs a definition's steps in a builder sandbox, checkpointing after
// each, and records the environment ready. A failed step fails the build
// with its output and exit code; the builder is closed either way, and
// only snapshots of complete prefixes are kept.
func (d *Daemon) build(ctx context.Context, def EnvDefinition, hash string, force bool, progress func(EnvProgress)) (_ string, err error) {
	start := time.Now()
	rec, err := d.store.GetEnvironment(ctx, def.Name)
	if err != nil {
		return "", err
	}
	prev := *rec
	rec.State, rec.Error = store.EnvBuilding, ""
	if err := d.store.PutEnvironment(ctx, rec); err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			// The old snapshot (if any) keeps serving. The record is left
			// alone if it changed meanwhile (redefined or deleted).
			if cur, gerr := d.store.GetEnvironment(ctx, def.Name); gerr == nil && cur.Hash == prev.Hash {
				cur.State, cur.Error = store.EnvFailed, err.Error()
				if cur.Checkpoint != "" && d.checkpointExists(ctx, cur.Checkpoint) {
					cur.State = store.EnvReady
				}
				d.store.PutEnvironment(ctx, cur)
			}
			d.envEvent(ctx, def.Name, "env.build_failed", map[string]any{"hash": hash, "error": err.Error()})
		}
	}()
	img, err := d.images.Get(ctx, def.Image)
	if err != nil {
		return "", err
	}
	// The longest prefix of the steps already built.
	from, fromCk := 0, ""
	if !force {
		for n := len(def.Steps) - 1; n >= 1; n-- {
			ck, _, err := d.store.EnvSnapshot(ctx, def.hashPrefix(img.Digest, n))
			if err != nil {
				return "", err
			}
			if ck != "" {
				if _, err := d.store.GetCheckpoint(ctx, ck); err == nil {
					from, fromCk = n, ck
					break
				}
			}
		}
	}
	d.envEvent(ctx, def.Name, "env.build_started", map[string]any{"hash": hash, "steps": len(def.Steps), "cached_steps": from, "force": force})
	if from > 0 {
		progress(EnvProgress{Phase: "cached", Step: from, Steps: len(def.Steps), Message: fmt.Sprintf("steps 1-%d already built (%s)", from, fromCk)})
	}
	progress(EnvProgress{Phase: "create", Steps: len(def.Steps), Message: "starting the builder sandbox"})
	cfg, _, err := d.validate(ctx, &CreateOptions{Image: def.Image, CPU: def.CPU, Memory: def.Memory, Pids: def.Pids,
		Env: def.Env, Cwd: def.Cwd, Egress: def.Egress, Runtime: def.Runtime})
	if err != nil {
		return "", err
	}
	builder, err := d.launch(ctx, launchSpec{name: "build-" + def.Name + "-" + randomHex(3), runtime: def.Runtime, cfg: *cfg, img: img,
		parentSnapshot: fromCk, event: map[string]any{"environment": def.Name, "hash": hash}})
	if err != nil {
		return "", err
	}
	defer d.Delete(context.WithoutCancel(ctx), builder.ID)
	ck := fromCk
	for i := from; i < len(def.Steps); i++ {
		if ck, err = d.runStep(ctx, def, img.Digest, builder, i, progress); err != nil {
			return "", err
		}
	}
	if len(def.Steps) == 0 || (from == len(def.Steps) && fromCk == "") {
		c, err := d.Checkpoint(ctx, builder.ID, "env:"+def.Name)
		if err != nil {
			return "", err
		}
		ck = c.ID
		if err := d.store.PutEnvSnapshot(ctx, hash, def.Name, ck, len(def.Steps)); err != nil {
			return "", err
		}
	}
	return ck, d.finishBuild(ctx, def, hash, ck, from, start, progress)
}

// runStep runs step i in the builder and checkpoints the result.
func (d *Daemon) runStep(ctx context.Context, def EnvDefinition, digest string, builder *store.Sandbox, i int, progress func(EnvProgress)) (string, error) {
	st := def.Steps[i]
	n := len(def.Steps)
	progress(EnvProgress{Phase: "step", Step: i + 1, Steps: n, Message: stepLabel(st)})
	t := time.Now()
	if st.WritePath != "" {
		if err := d.WriteFile(ctx, builder.ID, st.WritePath, st.WriteContent, st.WriteMode); err != nil {
			return "", fmt.Errorf("step %d (%s): %w", i+1, stepLabel(st), err)
		}
	} else {
		out := &progressWriter{step: i + 1, steps: n, progress: progress}
		res, err := d.Exec(ctx, builder.ID, ExecOptions{ExecRequest: agent.ExecRequest{Shell: st.Run}}, out, out)
		if err != nil {
			return "", fmt.Errorf("step %d (%s): %w", i+1, st.Run, err)
		}
		progress(EnvProgress{Phase: "step_done", Step: i + 1, Steps: n, ExitCode: res.ExitCode})
		d.envEvent(ctx, def.Name, "env.step", map[string]any{"step": i + 1, "command": st.Run, "exit_code": res.ExitCode,
			"duration_ms": msSince(t)})
		if res.ExitCode != 0 {
			return "", fmt.Errorf("step %d (%s) exited %d; its output ends: %q: %w", i+1, st.Run, res.ExitCode,
				tailBytes(out.buf, 2048), errdefs.ErrFailedPrecondition)
		}
	}
	c, err := d.Checkpoint(ctx, builder.ID, fmt.Sprintf("env:%s:step-%d", def.Name, i+1))
	if err != nil {
		return "", err
	}
	if err := d.store.PutEnvSnapshot(ctx, def.hashPrefix(digest, i+1), def.Name, c.ID, i+1); err != nil {
		return "", err
	}
	return c.ID, nil
}

// finishBuild points the environment at its new snapshot and records it.
func (d *Daemon) finishBuild(ctx context.Context, def EnvDefinition, hash, ck string, cached int, start time.Time, progress func(EnvProgress)) error {
	rec, err := d.store.GetEnvironment(ctx, def.Name)
	if err != nil {
		return err
	}
	if rec.Hash == hash {
		rec.Checkpoint, rec.BuiltAt, rec.BuildMS, rec.State, rec.Error, rec.CachedSteps = ck, time.Now(), msSince(start), store.EnvReady, "", cached
		if err := d.store.PutEnvironment(ctx, rec); err != nil {
			return err
		}
	}
	d.envEvent(ctx, def.Name, "env.build_finished", map[string]any{"hash": hash, "checkpoint": ck, "build_ms": msSince(start), "cached_steps": cached})
	progress(EnvProgress{Phase: "done", Steps: len(def.Steps), Message: ck})
	d.refillPool(def.Name)
	return nil
}

// progressWriter forwards step output as progress events and keeps its end
// for error messages.
type progressWriter struct {
	step, steps int
	progress    func(EnvProgress)
	buf         []byte
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.progress(EnvProgress{Phase: "output", Step: w.step, Steps: w.steps, Output: append([]byte(nil), p...)})
	w.buf = append(w.buf, p...)
	if len(w.buf) > 64<<10 {
		w.buf = w.buf[len(w.buf)-32<<10:]
	}
	return len(p), nil
}

// checkpointExists reports whether a checkpoint is still there (it may
// have been deleted under an environment that points at it: then the
// environment is built again).
func (d *Daemon) checkpointExists(ctx context.Context, id string) bool {
	_, err := d.store.GetCheckpoint(ctx, id)
	return err == nil
}
