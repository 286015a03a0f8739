package client

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// Checkpoint is an immutable capture of a sandbox.
type Checkpoint = v1.Checkpoint

// Overrides replace what a child inherits; zero fields are inherited.
type Overrides struct {
	Resources Resources
	Env       map[string]string
	Cwd       string
	Egress    string
	// EgressAllow and EgressDeny (with Egress) replace the inherited
	// egress policy as a whole when any of the three is given.
	EgressAllow, EgressDeny []string
	Name                    string
	// Timeout and OnTimeout replace the inherited ones (see
	// CreateOptions); the child's deadline counts from its own start.
	Timeout   time.Duration
	OnTimeout string
}

func (o Overrides) proto() *v1.Overrides {
	return &v1.Overrides{Resources: o.Resources.proto(),
		Env: o.Env, Cwd: o.Cwd, Egress: o.Egress, Name: o.Name, TimeoutMs: durationMs(o.Timeout), OnTimeout: o.OnTimeout,
		EgressAllow: o.EgressAllow, EgressDeny: o.EgressDeny}
}

// ForkOptions is one fork call. Count 0 means 1.
type ForkOptions struct {
	Tag       string
	Count     int
	Overrides Overrides
	// Credentials give values for the source's per-fork credentials.
	Credentials    map[string]string
	FromCheckpoint string
	// BestEffort starts as many children as there are slots for.
	BestEffort bool
	// Memory forks memory and processes too (gVisor): children continue the
	// source's processes.
	Memory bool
}

// ForkChild is one child: a sandbox, or the error that child got.
type ForkChild struct {
	Sandbox *Sandbox
	Err     error
	StartMS float64
}

// ForkResult is the outcome of a fork.
type ForkResult struct {
	Checkpoint *Checkpoint
	// Captured says what children start from ("filesystem").
	Captured string
	// CaptureMS is how long the source was frozen (freeze + snapshot +
	// thaw); FlushMS the writeback of its dirty data before that.
	CaptureMS float64
	// SourceDowntimeMS is how long the source stood still for a memory
	// fork (0 for a filesystem fork).
	SourceDowntimeMS float64
	FlushMS          float64
	TotalMS          float64
	Children         []ForkChild
}

// Sandboxes returns the children that started.
func (r *ForkResult) Sandboxes() []*Sandbox {
	var out []*Sandbox
	for _, c := range r.Children {
		if c.Sandbox != nil {
			out = append(out, c.Sandbox)
		}
	}
	return out
}

// Fork checkpoints the sandbox and starts children from that state; the
// sandbox keeps running. With Client.MaxConcurrency set, the children need
// that many free slots of this client.
func (s *Sandbox) Fork(ctx context.Context, o ForkOptions) (*ForkResult, error) {
	want := max(o.Count, 1)
	n := want
	if o.BestEffort {
		n = s.c.acquireUpTo(want)
		if n == 0 {
			return nil, s.c.acquire(1) // the ResourceExhausted error
		}
	} else if err := s.c.acquire(n); err != nil {
		return nil, err
	}
	resp, err := s.c.sbx.Fork(ctx, connect.NewRequest(&v1.ForkRequest{Sandbox: s.ID, Tag: o.Tag, Count: int32(n),
		Overrides: o.Overrides.proto(), Credentials: o.Credentials, FromCheckpoint: o.FromCheckpoint, BestEffort: o.BestEffort, Memory: o.Memory}))
	if err != nil {
		s.c.release(n)
		return nil, errconnect.FromConnect(err)
	}
	m := resp.Msg
	res := &ForkResult{Checkpoint: m.Checkpoint, Captured: m.Captured, CaptureMS: m.CaptureMs, FlushMS: m.FlushMs, TotalMS: m.TotalMs,
		SourceDowntimeMS: m.SourceDowntimeMs}
	started := 0
	for _, c := range m.Children {
		fc := ForkChild{StartMS: c.StartMs}
		if c.Sandbox != nil {
			fc.Sandbox = &Sandbox{c: s.c, ID: c.Sandbox.Id, Info: c.Sandbox, slot: true}
			started++
		}
		if c.Error != "" {
			fc.Err = errdefs.FromClassName(c.ErrorClass, c.Error)
		}
		res.Children = append(res.Children, fc)
	}
	s.c.release(n - started)
	for i := n; i < want; i++ {
		res.Children = append(res.Children, ForkChild{Err: fmt.Errorf("child %d of %d: no free slot of this client (MaxConcurrency %d): %w",
			i+1, want, s.c.MaxConcurrency, errdefs.ErrResourceExhausted)})
	}
	return res, nil
}

// ForkOne forks a single child and returns it (the seed's sb.fork(tag)).
func (s *Sandbox) ForkOne(ctx context.Context, tag string) (*Sandbox, error) {
	res, err := s.Fork(ctx, ForkOptions{Tag: tag, Count: 1})
	if err != nil {
		return nil, err
	}
	if c := res.Children[0]; c.Err != nil {
		return nil, c.Err
	}
	return res.Children[0].Sandbox, nil
}

// Checkpoint captures the sandbox's filesystem under tag.
func (s *Sandbox) Checkpoint(ctx context.Context, tag string) (*Checkpoint, error) {
	return s.checkpoint(ctx, tag, false)
}

// CheckpointMemory captures memory and processes too (gVisor).
func (s *Sandbox) CheckpointMemory(ctx context.Context, tag string) (*Checkpoint, error) {
	return s.checkpoint(ctx, tag, true)
}

func (s *Sandbox) checkpoint(ctx context.Context, tag string, memory bool) (*Checkpoint, error) {
	resp, err := s.c.sbx.Checkpoint(ctx, connect.NewRequest(&v1.CheckpointRequest{Sandbox: s.ID, Tag: tag, Memory: memory}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg.Checkpoint, nil
}

// ListCheckpoints lists the sandbox's checkpoints, oldest first.
func (s *Sandbox) ListCheckpoints(ctx context.Context) ([]*Checkpoint, error) {
	var out []*Checkpoint
	req := &v1.ListCheckpointsRequest{Sandbox: s.ID, PageSize: fullPage}
	for {
		resp, err := s.c.sbx.ListCheckpoints(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, errconnect.FromConnect(err)
		}
		out = append(out, resp.Msg.Checkpoints...)
		if resp.Msg.NextPageToken == "" {
			return out, nil
		}
		req.PageToken = resp.Msg.NextPageToken
	}
}

// DeleteCheckpoint deletes a checkpoint.
func (c *Client) DeleteCheckpoint(ctx context.Context, id string) error {
	c.init()
	_, err := c.sbx.DeleteCheckpoint(ctx, connect.NewRequest(&v1.DeleteCheckpointRequest{Checkpoint: id}))
	return errconnect.FromConnect(err)
}

// EgressOptions is a sandbox's new egress policy: Egress "none", "all" or
// "allow" ("" = "allow" with an Allow list, else "none"), and its lists.
type EgressOptions struct {
	Egress      string
	Allow, Deny []string
}

// SetEgress replaces the sandbox's egress policy while it runs. Open
// connections stay; addresses resolved under the old policy stop passing.
func (s *Sandbox) SetEgress(ctx context.Context, o EgressOptions) error {
	resp, err := s.c.sbx.SetEgress(ctx, connect.NewRequest(&v1.SetEgressRequest{Sandbox: s.ID, Egress: o.Egress,
		EgressAllow: o.Allow, EgressDeny: o.Deny}))
	if err != nil {
		return errconnect.FromConnect(err)
	}
	s.Info = resp.Msg.Sandbox
	return nil
}

// Pause freezes the sandbox in place.
func (s *Sandbox) Pause(ctx context.Context) error {
	resp, err := s.c.sbx.PauseSandbox(ctx, connect.NewRequest(&v1.PauseSandboxRequest{Sandbox: s.ID}))
	if err != nil {
		return errconnect.FromConnect(err)
	}
	s.Info = resp.Msg.Sandbox
	return nil
}

// Unpause thaws a paused sandbox.
func (s *Sandbox) Unpause(ctx context.Context) error {
	resp, err := s.c.sbx.UnpauseSandbox(ctx, connect.NewRequest(&v1.UnpauseSandboxRequest{Sandbox: s.ID}))
	if err != nil {
		return errconnect.FromConnect(err)
	}
	s.Info = resp.Msg.Sandbox
	return nil
}

// Hibernate saves the sandbox's memory and processes to disk and releases
// them; the next exec (or Wake) restores it with its state intact.
func (s *Sandbox) Hibernate(ctx context.Context) error {
	resp, err := s.c.sbx.HibernateSandbox(ctx, connect.NewRequest(&v1.HibernateSandboxRequest{Sandbox: s.ID}))
	if err != nil {
		return errconnect.FromConnect(err)
	}
	s.Info = resp.Msg.Sandbox
	return nil
}

// Wake restores a hibernated sandbox.
func (s *Sandbox) Wake(ctx context.Context) error {
	resp, err := s.c.sbx.WakeSandbox(ctx, connect.NewRequest(&v1.WakeSandboxRequest{Sandbox: s.ID}))
	if err != nil {
		return errconnect.FromConnect(err)
	}
	s.Info = resp.Msg.Sandbox
	return nil
}

// RestoreSnapshot starts a new sandbox from a checkpoint, with a clean exec
// history.
func (c *Client) RestoreSnapshot(ctx context.Context, checkpoint string, o Overrides, credentials map[string]string) (*Sandbox, error) {
	c.init()
	if err := c.acquire(1); err != nil {
		return nil, err
	}
	resp, err := c.sbx.RestoreSnapshot(ctx, connect.NewRequest(&v1.RestoreSnapshotRequest{Checkpoint: checkpoint, Overrides: o.proto(), Credentials: credentials}))
	if err != nil {
		c.release(1)
		return nil, errconnect.FromConnect(err)
	}
	return &Sandbox{c: c, ID: resp.Msg.Sandbox.Id, Info: resp.Msg.Sandbox, slot: true}, nil
}

// ReplayedExec is one exec that Resume replayed (or skipped).
type ReplayedExec = v1.ReplayedExec

// ResumeResult is a resumed session.
type ResumeResult struct {
	Sandbox    *Sandbox
	Checkpoint *Checkpoint
	Replayed   []*ReplayedExec
}

// Resume brings back a closed or crashed session (a sandbox ID or name):
// its last checkpoint is restored and the execs after it are replayed.
func (c *Client) Resume(ctx context.Context, session string) (*ResumeResult, error) {
	c.init()
	if err := c.acquire(1); err != nil {
		return nil, err
	}
	resp, err := c.sbx.Resume(ctx, connect.NewRequest(&v1.ResumeRequest{Session: session}))
	if err != nil {
		c.release(1)
		return nil, errconnect.FromConnect(err)
	}
	m := resp.Msg
	return &ResumeResult{Sandbox: &Sandbox{c: c, ID: m.Sandbox.Id, Info: m.Sandbox, slot: true}, Checkpoint: m.Checkpoint, Replayed: m.Replayed}, nil
}

// Credential describes how a credential is injected.
type Credential = v1.Credential

// Credentials manages a sandbox's credentials.
type Credentials struct{ s *Sandbox }

// Credentials returns the sandbox's credentials manager.
func (s *Sandbox) Credentials() Credentials { return Credentials{s} }

// CredentialOptions say how a credential reaches the sandbox: as an env
// variable of every exec, as a file /run/secrets/<File>, or both. PerFork
// credentials are not copied to forks.
type CredentialOptions struct {
	Env     string
	File    string
	PerFork bool
}

// Set stores a credential (encrypted at rest; never logged).
func (cr Credentials) Set(ctx context.Context, name, value string, o CredentialOptions) error {
	if o.Env == "" && o.File == "" {
		o.Env = name
	}
	_, err := cr.s.c.sbx.SetCredential(ctx, connect.NewRequest(&v1.SetCredentialRequest{Sandbox: cr.s.ID, Value: value,
		Credential: &v1.Credential{Name: name, Env: o.Env, File: o.File, PerFork: o.PerFork}}))
	return errconnect.FromConnect(err)
}

// List lists credentials (never values).
func (cr Credentials) List(ctx context.Context) ([]*Credential, error) {
	resp, err := cr.s.c.sbx.ListCredentials(ctx, connect.NewRequest(&v1.ListCredentialsRequest{Sandbox: cr.s.ID}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg.Credentials, nil
}

// Delete removes a credential.
func (cr Credentials) Delete(ctx context.Context, name string) error {
	_, err := cr.s.c.sbx.DeleteCredential(ctx, connect.NewRequest(&v1.DeleteCredentialRequest{Sandbox: cr.s.ID, Name: name}))
	return errconnect.FromConnect(err)
}

// acquire takes n of this client's concurrency slots.
func (c *Client) acquire(n int) error {
	if c.MaxConcurrency <= 0 {
		return nil
	}
	c.slotMu.Lock()
	defer c.slotMu.Unlock()
	if c.inUse+n > c.MaxConcurrency {
		return fmt.Errorf("%d sandbox slots needed, %d of this client's %d free (MaxConcurrency): %w",
			n, c.MaxConcurrency-c.inUse, c.MaxConcurrency, errdefs.ErrResourceExhausted)
	}
	c.inUse += n
	return nil
}

// acquireUpTo takes as many of want slots as are free, and says how many.
func (c *Client) acquireUpTo(want int) int {
	if c.MaxConcurrency <= 0 {
		return want
	}
	c.slotMu.Lock()
	defer c.slotMu.Unlock()
	n := min(want, max(c.MaxConcurrency-c.inUse, 0))
	c.inUse += n
	return n
}

func (c *Client) release(n int) {
	if c.MaxConcurrency <= 0 || n <= 0 {
		return
	}
	c.slotMu.Lock()
	c.inUse -= n
	c.slotMu.Unlock()
}
