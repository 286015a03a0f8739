package client

import (
	"context"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// SetupStep is one step of an environment's setup: a shell command (Run),
// or a file to write.
type SetupStep = v1.SetupStep

// Run is a setup step that runs a shell command.
func Run(cmd string) *SetupStep { return &SetupStep{Run: cmd} }

// WriteFile is a setup step that writes a file.
func WriteFile(path string, content []byte, mode uint32) *SetupStep {
	return &SetupStep{WritePath: path, WriteContent: content, WriteMode: mode}
}

// EnvironmentOptions define an environment: a declarative baseline built
// once into a warm snapshot and forked per sandbox.
type EnvironmentOptions struct {
	Image     string
	Resources Resources
	Env       map[string]string
	Cwd       string
	Runtime   string
	Egress    string
	Setup     []*SetupStep
	// MaxAge rebuilds the snapshot in the background once it is older.
	MaxAge time.Duration
	// PoolSize keeps that many sandboxes forked and started, ready to hand over.
	PoolSize int
	// Start leaves processes running after the setup (gVisor only): the
	// snapshot is a memory checkpoint, and every sandbox of the
	// environment continues them (a server started here answers at once).
	Start *StartCommand
}

// StartCommand is what an environment leaves running: Run is started in
// the background after the setup steps; the snapshot is taken once
// ReadyPort listens and ReadyCommand exits 0 (those that are set), within
// ReadyTimeoutMs (0: 60 s).
type StartCommand = v1.StartCommand

// EnvironmentInfo is what the daemon knows of an environment.
type EnvironmentInfo = v1.Environment

// Environment is a handle on an environment definition.
type Environment struct {
	c   *Client
	def *v1.EnvironmentDefinition
}

// Environment returns a handle on the environment name with this
// definition. Nothing is built until Build or Sandbox.
func (c *Client) Environment(name string, o EnvironmentOptions) *Environment {
	c.init()
	return &Environment{c: c, def: &v1.EnvironmentDefinition{Name: name, Image: o.Image, Env: o.Env, Cwd: o.Cwd,
		Runtime: o.Runtime, Egress: o.Egress, Steps: o.Setup, MaxAgeSeconds: int64(o.MaxAge / time.Second), PoolSize: int32(o.PoolSize),
		Resources: o.Resources.proto(), Start: o.Start}}
}

// BuildProgress is one progress event of a build.
type BuildProgress = v1.BuildProgress

// Build builds the environment unless it is built, reporting progress.
func (e *Environment) Build(ctx context.Context, progress func(*BuildProgress)) (*EnvironmentInfo, error) {
	s, err := e.c.envs.BuildEnvironment(ctx, connect.NewRequest(&v1.BuildEnvironmentRequest{Definition: e.def}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	defer s.Close()
	var info *EnvironmentInfo
	for s.Receive() {
		m := s.Msg()
		if m.Environment != nil {
			info = m.Environment
		}
		if progress != nil {
			progress(m)
		}
	}
	return info, errconnect.FromConnect(s.Err())
}

// EnvSandbox is a sandbox handed over by an environment.
type EnvSandbox struct {
	*Sandbox
	FromPool   bool
	HandoverMS float64
	// Built says this call built the environment first.
	Built bool
}

// Sandbox hands over a sandbox of the environment: from its warm pool, or
// forked from its snapshot (built first if needed).
func (e *Environment) Sandbox(ctx context.Context, o Overrides) (*EnvSandbox, error) {
	if err := e.c.acquire(1); err != nil {
		return nil, err
	}
	resp, err := e.c.envs.EnvironmentSandbox(ctx, connect.NewRequest(&v1.EnvironmentSandboxRequest{Definition: e.def, Overrides: o.proto()}))
	if err != nil {
		e.c.release(1)
		return nil, errconnect.FromConnect(err)
	}
	m := resp.Msg
	return &EnvSandbox{Sandbox: &Sandbox{c: e.c, ID: m.Sandbox.Id, Info: m.Sandbox, slot: true}, FromPool: m.FromPool,
		HandoverMS: m.HandoverMs, Built: m.Built}, nil
}

// Info returns the environment's state.
func (e *Environment) Info(ctx context.Context) (*EnvironmentInfo, error) {
	return e.c.GetEnvironment(ctx, e.def.Name)
}

// GetEnvironment returns an environment by name.
func (c *Client) GetEnvironment(ctx context.Context, name string) (*EnvironmentInfo, error) {
	c.init()
	resp, err := c.envs.GetEnvironment(ctx, connect.NewRequest(&v1.GetEnvironmentRequest{Name: name}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg.Environment, nil
}

// ListEnvironments lists environments.
func (c *Client) ListEnvironments(ctx context.Context) ([]*EnvironmentInfo, error) {
	c.init()
	resp, err := c.envs.ListEnvironments(ctx, connect.NewRequest(&v1.ListEnvironmentsRequest{}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg.Environments, nil
}

// DeleteEnvironment deletes an environment, its pool and its snapshots.
func (c *Client) DeleteEnvironment(ctx context.Context, name string) error {
	c.init()
	_, err := c.envs.DeleteEnvironment(ctx, connect.NewRequest(&v1.DeleteEnvironmentRequest{Name: name}))
	return errconnect.FromConnect(err)
}

// SandboxFromEnvironment hands over a sandbox of the built environment
// called name, through the same path as Environment(...).Sandbox: from its
// warm pool when one is ready (only when o is empty), else forked from its
// snapshot. It never builds: an unknown name is NotFound, an environment
// without a snapshot FailedPrecondition.
func (c *Client) SandboxFromEnvironment(ctx context.Context, name string, o Overrides) (*EnvSandbox, error) {
	c.init()
	if err := c.acquire(1); err != nil {
		return nil, err
	}
	resp, err := c.envs.EnvironmentSandbox(ctx, connect.NewRequest(&v1.EnvironmentSandboxRequest{Name: name, Overrides: o.proto(), NoBuild: true}))
	if err != nil {
		c.release(1)
		return nil, errconnect.FromConnect(err)
	}
	m := resp.Msg
	return &EnvSandbox{Sandbox: &Sandbox{c: c, ID: m.Sandbox.Id, Info: m.Sandbox, slot: true}, FromPool: m.FromPool,
		HandoverMS: m.HandoverMs, Built: m.Built}, nil
}
