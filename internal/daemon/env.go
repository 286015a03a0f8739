package daemon

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/env"
	"github.com/forkbox/forkbox/internal/store"
)

// Environments live in package env; the daemon serves them to the API and
// is the env.Sandboxes they start, run and checkpoint sandboxes through.

type (
	// EnvDefinition is an environment's declarative definition.
	EnvDefinition = env.Definition
	// SetupStep is one step of an environment's setup.
	SetupStep = env.SetupStep
	// StartCommand is what an environment leaves running in its snapshot.
	StartCommand = env.StartCommand
	// EnvStatus is an environment as the API shows it.
	EnvStatus = env.Status
	// EnvProgress is one build progress event.
	EnvProgress = env.Progress
	// EnvSandboxResult is a sandbox handed over by an environment.
	EnvSandboxResult = env.SandboxResult
)

// EnvDefinitionOf returns the definition an environment record holds.
func EnvDefinitionOf(rec *store.Environment) EnvDefinition { return env.DefinitionOf(rec) }

// BuildEnvironment defines an environment and builds it unless its hash is
// built already (see env.Manager.Build).
func (d *Daemon) BuildEnvironment(ctx context.Context, def EnvDefinition, force bool, progress func(EnvProgress)) (*EnvStatus, bool, error) {
	return d.envs.Build(ctx, def, force, progress)
}

// EnvironmentSandbox hands over a sandbox of an environment (see
// env.Manager.Sandbox).
func (d *Daemon) EnvironmentSandbox(ctx context.Context, def *EnvDefinition, name string, o Overrides) (*EnvSandboxResult, error) {
	return d.envs.Sandbox(ctx, def, name, envOverrides(o))
}

// EnvironmentSandboxBuilt hands over a sandbox of the environment called
// name, which must be built: one without a snapshot is a
// FailedPrecondition, an unknown name NotFound.
func (d *Daemon) EnvironmentSandboxBuilt(ctx context.Context, name string, o Overrides) (*EnvSandboxResult, error) {
	return d.envs.SandboxBuilt(ctx, name, envOverrides(o))
}

// GetEnvironment returns an environment.
func (d *Daemon) GetEnvironment(ctx context.Context, name string) (*EnvStatus, error) {
	return d.envs.Get(ctx, name)
}

// ListEnvironments lists environments.
func (d *Daemon) ListEnvironments(ctx context.Context) ([]*EnvStatus, error) { return d.envs.List(ctx) }

// DeleteEnvironment deletes an environment, its pool and its snapshots.
// Sandboxes handed over from it are not affected.
func (d *Daemon) DeleteEnvironment(ctx context.Context, name string) error {
	return d.envs.Delete(ctx, name)
}

// BeginBuild returns the environment if its hash is built, or a builder
// sandbox and a lease for the caller to run the setup in.
func (d *Daemon) BeginBuild(ctx context.Context, def EnvDefinition) (*EnvStatus, *store.Sandbox, string, error) {
	return d.envs.BeginBuild(ctx, def)
}

// CompleteBuild ends a build lease.
func (d *Daemon) CompleteBuild(ctx context.Context, id string, ok bool, reason string) (*EnvStatus, error) {
	return d.envs.CompleteBuild(ctx, id, ok, reason)
}

func envOverrides(o Overrides) env.Overrides {
	return env.Overrides{CPU: o.CPU, Memory: o.Memory, Pids: o.Pids, Disk: o.Disk, Env: o.Env, Cwd: o.Cwd, Egress: o.Egress, Name: o.Name}
}

// envSandboxes is the daemon as environments see it.
type envSandboxes struct{ d *Daemon }

var _ env.Sandboxes = envSandboxes{}

func createOptions(def *env.Definition) CreateOptions {
	return CreateOptions{Image: def.Image, Name: def.Name, CPU: def.CPU, Memory: def.Memory, Pids: def.Pids, Disk: def.Disk, Env: def.Env,
		Cwd: def.Cwd, Egress: def.Egress, Runtime: def.Runtime}
}

func (a envSandboxes) Validate(ctx context.Context, def *env.Definition) (string, error) {
	o := createOptions(def)
	_, img, err := a.d.validate(ctx, &o)
	if err != nil {
		return "", err
	}
	def.Runtime = o.Runtime
	if def.Start != nil {
		// Its snapshot is a memory checkpoint: refused before anything is
		// built where the runtime cannot take one.
		if _, ok := a.d.runtimes[o.Runtime].(runtime.MemoryCheckpointer); !ok {
			return "", fmt.Errorf("environment %s has a start command, so its snapshot is a memory checkpoint, which the %s runtime cannot take (use the gvisor runtime): %w",
				def.Name, o.Runtime, errdefs.ErrFailedPrecondition)
		}
	}
	return img.Digest, nil
}

func (a envSandboxes) StartBuilder(ctx context.Context, def env.Definition, hash, from string) (*store.Sandbox, error) {
	o := createOptions(&def)
	o.Name = ""
	cfg, img, err := a.d.validate(ctx, &o)
	if err != nil {
		return nil, err
	}
	return a.d.launch(ctx, launchSpec{name: "build-" + def.Name + "-" + randomHex(3), runtime: o.Runtime, cfg: *cfg, img: img,
		parentSnapshot: from, event: map[string]any{"environment": def.Name, "hash": hash}})
}

func (a envSandboxes) StartFromCheckpoint(ctx context.Context, checkpoint string, o env.Overrides, pool string, event map[string]any) (*store.Sandbox, error) {
	ck, err := a.d.store.GetCheckpoint(ctx, checkpoint)
	if err != nil {
		return nil, err
	}
	return a.d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, pool: pool, event: event,
		overrides: Overrides{CPU: o.CPU, Memory: o.Memory, Pids: o.Pids, Disk: o.Disk, Env: o.Env, Cwd: o.Cwd, Egress: o.Egress, Name: o.Name}})
}

func (a envSandboxes) Exec(ctx context.Context, sandbox, shell string, stdout, stderr io.Writer) (int, error) {
	res, err := a.d.Exec(ctx, sandbox, ExecOptions{ExecRequest: agent.ExecRequest{Shell: shell}}, stdout, stderr)
	return res.ExitCode, err
}

func (a envSandboxes) WriteFile(ctx context.Context, sandbox, path string, data []byte, mode uint32) error {
	return a.d.WriteFile(ctx, sandbox, path, data, mode)
}

func (a envSandboxes) Checkpoint(ctx context.Context, sandbox, tag string) (string, error) {
	ck, err := a.d.Checkpoint(ctx, sandbox, tag)
	if err != nil {
		return "", err
	}
	return ck.ID, nil
}

func (a envSandboxes) Start(ctx context.Context, sandbox, shell string) (int, error) {
	return a.d.Start(ctx, sandbox, ExecOptions{ExecRequest: agent.ExecRequest{Shell: shell}})
}

func (a envSandboxes) Probe(ctx context.Context, sandbox, shell string, timeout time.Duration) (int, error) {
	res, err := a.d.Exec(ctx, sandbox, ExecOptions{ExecRequest: agent.ExecRequest{Shell: shell, Timeout: timeout}, NonReplayable: true},
		io.Discard, io.Discard)
	return res.ExitCode, err
}

func (a envSandboxes) ReadFile(ctx context.Context, sandbox, path string) ([]byte, error) {
	return a.d.ReadFile(ctx, sandbox, path)
}

func (a envSandboxes) CheckpointMemory(ctx context.Context, sandbox, tag string) (string, error) {
	ck, err := a.d.checkpointDisposable(ctx, sandbox, tag)
	if err != nil {
		return "", err
	}
	return ck.ID, nil
}

func (a envSandboxes) DeleteCheckpoint(ctx context.Context, checkpoint string) error {
	return a.d.deleteCheckpoint(ctx, checkpoint)
}

func (a envSandboxes) Delete(ctx context.Context, sandbox string) error {
	return a.d.Delete(ctx, sandbox)
}
