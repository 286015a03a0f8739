package mcpserver

import (
	"context"
	"encoding/base64"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// Bounds of what goes in and out of the tools.
const (
	DefaultMaxOutputBytes = 64 << 10 // exec: kept of stdout, and of stderr
	MaxOutputBytesLimit   = 1 << 20
	DefaultReadBytes      = 256 << 10 // read_file
	ReadBytesLimit        = 4 << 20
	WriteBytesLimit       = 4 << 20 // write_file, after decoding
	StdinLimit            = 1 << 20
	DefaultExecTimeout    = 5 * time.Minute
	MaxForkCount          = 100
)

type tools struct{ c *client.Client }

func (t *tools) register(s *mcp.Server) {
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true}
	add(s, "create", "Create a sandbox from an image and wait until it is ready. Returns the sandbox (its id and name name it in the other tools).", nil, t.create)
	add(s, "exec", "Run a command in a sandbox and wait for it: its exit code and output. Output beyond max_output_bytes keeps only its last bytes and sets stdout_truncated / stderr_truncated. A non-zero exit is a result, not an error.", nil, t.exec)
	add(s, "write_file", "Write a file in a sandbox (content as UTF-8 text, or base64 with encoding \"base64\").", nil, t.writeFile)
	add(s, "read_file", "Read a file in a sandbox: at most max_bytes of it (truncated says when there was more). Text comes back as UTF-8; other bytes as base64 (encoding says which).", ro, t.readFile)
	add(s, "fork", "Fork a sandbox: checkpoint its current state (the source keeps running) and start count independent children from it. Returns per-child results: each child's sandbox, or its error.", nil, t.fork)
	add(s, "checkpoint", "Checkpoint a sandbox's state under a tag; the checkpoint can be restored or forked from later.", nil, t.checkpoint)
	add(s, "list", "List the live sandboxes (all: closed ones too), or, given a sandbox, its checkpoints.", ro, t.list)
	add(s, "restore", "Start a new sandbox from a checkpoint, with a clean exec history.", nil, t.restore)
	add(s, "close", "Close a sandbox: it stops and nothing of it is left (its checkpoints and ledger remain).", &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true}, t.close)
}

func ptr[T any](v T) *T { return &v }

// add registers a typed tool whose errors leave as tool errors naming their class.
func add[In, Out any](s *mcp.Server, name, desc string, ann *mcp.ToolAnnotations, h func(context.Context, In) (Out, error)) {
	mcp.AddTool(s, &mcp.Tool{Name: name, Description: desc, Annotations: ann},
		func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
			out, err := h(ctx, in)
			return nil, out, classed(err)
		})
}

// Sandbox is a sandbox as the tools return it.
type Sandbox struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	State          string `json:"state" jsonschema:"creating, running, paused, hibernated, stopped, failed or closed"`
	Image          string `json:"image"`
	Runtime        string `json:"runtime,omitempty"`
	Hostname       string `json:"hostname,omitempty"`
	IP             string `json:"ip,omitempty"`
	ParentID       string `json:"parent_id,omitempty" jsonschema:"the sandbox it was forked from"`
	FromCheckpoint string `json:"from_checkpoint,omitempty" jsonschema:"the checkpoint it started from"`
	CreatedAt      string `json:"created_at" jsonschema:"RFC 3339"`
	Error          string `json:"error,omitempty"`
}

func sandboxOut(i *client.Info) Sandbox {
	return Sandbox{
		ID: i.Id, Name: i.Name, State: i.State, Image: i.Image, Runtime: i.Runtime, Hostname: i.Hostname, IP: i.Ip,
		ParentID: i.ParentId, FromCheckpoint: i.FromCheckpoint, Error: i.Error,
		CreatedAt: time.UnixMilli(i.CreatedAtUnixMs).UTC().Format(time.RFC3339Nano),
	}
}

// Checkpoint is a checkpoint as the tools return it.
type Checkpoint struct {
	ID          string  `json:"id"`
	Tag         string  `json:"tag,omitempty"`
	SandboxID   string  `json:"sandbox_id"`
	SandboxName string  `json:"sandbox_name,omitempty"`
	Kind        string  `json:"kind" jsonschema:"filesystem or filesystem+memory"`
	Size        int64   `json:"size" jsonschema:"bytes, where known"`
	CaptureMS   float64 `json:"capture_ms" jsonschema:"how long the source was frozen"`
	CreatedAt   string  `json:"created_at" jsonschema:"RFC 3339"`
}

func checkpointOut(c *client.Checkpoint) *Checkpoint {
	if c == nil {
		return nil
	}
	return &Checkpoint{
		ID: c.Id, Tag: c.Tag, SandboxID: c.SandboxId, SandboxName: c.SandboxName, Kind: c.Kind, Size: c.Size,
		CaptureMS: c.CaptureMs, CreatedAt: time.UnixMilli(c.CreatedAtUnixMs).UTC().Format(time.RFC3339Nano),
	}
}

// CreateIn is the input of create.
type CreateIn struct {
	Image   string            `json:"image" jsonschema:"image name or digest"`
	Name    string            `json:"name,omitempty" jsonschema:"sandbox name (default: its ID)"`
	CPU     string            `json:"cpu,omitempty" jsonschema:"CPU cores, e.g. 1 or 0.5"`
	Memory  string            `json:"memory,omitempty" jsonschema:"memory, e.g. 512Mi or 2Gi"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"environment of every exec"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"working directory of execs"`
	Egress  string            `json:"egress,omitempty" jsonschema:"outbound network: none (default), all, or allow (implied by egress_allow)"`
	Runtime string            `json:"runtime,omitempty" jsonschema:"gvisor or crun (default: the daemon's)"`
	// EgressAllow and EgressDeny are the egress lists (see the README's
	// "Egress allowlists").
	EgressAllow []string `json:"egress_allow,omitempty" jsonschema:"CIDRs and DNS names (api.example.com, *.example.com) the sandbox may reach"`
	EgressDeny  []string `json:"egress_deny,omitempty" jsonschema:"CIDRs (and names, with egress_allow) it may not reach; wins over egress_allow"`
}

func (t *tools) create(ctx context.Context, in CreateIn) (Sandbox, error) {
	if in.Image == "" {
		return Sandbox{}, errInvalid("image is required")
	}
	sb, err := t.c.CreateSandbox(ctx, client.CreateOptions{
		Image: in.Image, Name: in.Name, Env: in.Env, Cwd: in.Cwd, Egress: in.Egress, Runtime: in.Runtime,
		Resources: client.Resources{CPU: in.CPU, Memory: in.Memory}, EgressAllow: in.EgressAllow, EgressDeny: in.EgressDeny,
	})
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOut(sb.Info), nil
}

// ExecIn is the input of exec.
type ExecIn struct {
	Sandbox        string            `json:"sandbox" jsonschema:"sandbox ID or name"`
	Command        string            `json:"command,omitempty" jsonschema:"a shell command, run with /bin/sh -c (give command or argv)"`
	Argv           []string          `json:"argv,omitempty" jsonschema:"the program and its arguments (give command or argv)"`
	Cwd            string            `json:"cwd,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text given to the command's standard input (at most 1 MiB)"`
	TimeoutMS      int64             `json:"timeout_ms,omitempty" jsonschema:"kill the command after this many milliseconds (default 300000)"`
	MaxOutputBytes int               `json:"max_output_bytes,omitempty" jsonschema:"bytes of stdout, and of stderr, returned: the last ones (default 65536, at most 1048576)"`
}

// ExecOut is how a command ended.
type ExecOut struct {
	ExitCode        int     `json:"exit_code"`
	Signal          string  `json:"signal,omitempty" jsonschema:"the signal that ended it, e.g. SIGKILL"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutTruncated bool    `json:"stdout_truncated" jsonschema:"stdout was longer than max_output_bytes: only its end is here"`
	StderrTruncated bool    `json:"stderr_truncated" jsonschema:"stderr was longer than max_output_bytes: only its end is here"`
	DurationMS      float64 `json:"duration_ms"`
	TimedOut        bool    `json:"timed_out"`
	OOMKilled       bool    `json:"oom_killed"`
}

func (t *tools) exec(ctx context.Context, in ExecIn) (ExecOut, error) {
	if (in.Command == "") == (len(in.Argv) == 0) {
		return ExecOut{}, errInvalid("give command or argv (one of them)")
	}
	max := in.MaxOutputBytes
	switch {
	case max == 0:
		max = DefaultMaxOutputBytes
	case max < 0 || max > MaxOutputBytesLimit:
		return ExecOut{}, errInvalid("max_output_bytes %d: want 1 to %d", max, MaxOutputBytesLimit)
	}
	if len(in.Stdin) > StdinLimit {
		return ExecOut{}, errInvalid("stdin of %d bytes: at most %d", len(in.Stdin), StdinLimit)
	}
	timeout := DefaultExecTimeout
	if in.TimeoutMS < 0 {
		return ExecOut{}, errInvalid("timeout_ms %d: want a positive number", in.TimeoutMS)
	} else if in.TimeoutMS > 0 {
		timeout = time.Duration(in.TimeoutMS) * time.Millisecond
	}
	sb, err := t.c.Sandbox(ctx, in.Sandbox)
	if err != nil {
		return ExecOut{}, err
	}
	stdout, stderr := &tail{max: max}, &tail{max: max}
	o := client.ExecOptions{Argv: in.Argv, Shell: in.Command, Cwd: in.Cwd, Env: in.Env, Timeout: timeout, Stdout: stdout, Stderr: stderr}
	if in.Stdin != "" {
		o.Stdin = []byte(in.Stdin)
	}
	res, err := sb.Exec(ctx, o)
	if err != nil {
		return ExecOut{}, err
	}
	return ExecOut{
		ExitCode: res.ExitCode, Signal: res.Signal, DurationMS: float64(res.Duration.Microseconds()) / 1000,
		TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
		Stdout: stdout.String(), Stderr: stderr.String(), StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated,
	}, nil
}

// WriteFileIn is the input of write_file.
type WriteFileIn struct {
	Sandbox  string `json:"sandbox" jsonschema:"sandbox ID or name"`
	Path     string `json:"path" jsonschema:"absolute path in the sandbox"`
	Content  string `json:"content" jsonschema:"the file's content (at most 4 MiB)"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64"`
	Mode     uint32 `json:"mode,omitempty" jsonschema:"permission bits, e.g. 493 for 0755 (default 0644)"`
}

// WriteFileOut says what was written.
type WriteFileOut struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

func (t *tools) writeFile(ctx context.Context, in WriteFileIn) (WriteFileOut, error) {
	var data []byte
	switch in.Encoding {
	case "", "utf8", "utf-8":
		data = []byte(in.Content)
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return WriteFileOut{}, errInvalid("content is not base64: %v", err)
		}
	default:
		return WriteFileOut{}, errInvalid("encoding %q: want utf8 or base64", in.Encoding)
	}
	if len(data) > WriteBytesLimit {
		return WriteFileOut{}, errInvalid("content of %d bytes: at most %d", len(data), WriteBytesLimit)
	}
	sb, err := t.c.Sandbox(ctx, in.Sandbox)
	if err != nil {
		return WriteFileOut{}, err
	}
	if err := sb.WriteFile(ctx, in.Path, data, in.Mode); err != nil {
		return WriteFileOut{}, err
	}
	return WriteFileOut{Path: in.Path, Bytes: len(data)}, nil
}

// ReadFileIn is the input of read_file.
type ReadFileIn struct {
	Sandbox  string `json:"sandbox" jsonschema:"sandbox ID or name"`
	Path     string `json:"path" jsonschema:"absolute path in the sandbox"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"bytes returned at most, from the start (default 262144, at most 4194304)"`
}

// ReadFileOut is (the start of) a file.
type ReadFileOut struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	Encoding  string `json:"encoding" jsonschema:"utf8, or base64 when the bytes are not UTF-8 text"`
	Size      int    `json:"size" jsonschema:"the file's size in bytes"`
	Truncated bool   `json:"truncated" jsonschema:"the file is longer than max_bytes: content is its start"`
}

func (t *tools) readFile(ctx context.Context, in ReadFileIn) (ReadFileOut, error) {
	max := in.MaxBytes
	switch {
	case max == 0:
		max = DefaultReadBytes
	case max < 0 || max > ReadBytesLimit:
		return ReadFileOut{}, errInvalid("max_bytes %d: want 1 to %d", max, ReadBytesLimit)
	}
	sb, err := t.c.Sandbox(ctx, in.Sandbox)
	if err != nil {
		return ReadFileOut{}, err
	}
	data, err := sb.ReadFile(ctx, in.Path)
	if err != nil {
		return ReadFileOut{}, err
	}
	out := ReadFileOut{Path: in.Path, Size: len(data), Encoding: "utf8"}
	if len(data) > max {
		data, out.Truncated = data[:max], true
		// A text file cut inside a character stays text.
		if !utf8.Valid(data) {
			for cut := 1; cut < utf8.UTFMax && cut <= len(data); cut++ {
				if utf8.Valid(data[:len(data)-cut]) {
					data = data[:len(data)-cut]
					break
				}
			}
		}
	}
	if utf8.Valid(data) {
		out.Content = string(data)
	} else {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
	}
	return out, nil
}

// ForkIn is the input of fork.
type ForkIn struct {
	Sandbox        string            `json:"sandbox" jsonschema:"sandbox ID or name"`
	Count          int               `json:"count,omitempty" jsonschema:"number of children, 1 to 100 (default 1)"`
	Tag            string            `json:"tag,omitempty" jsonschema:"tag of the checkpoint the fork takes"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment merged over the inherited one, in every child"`
	FromCheckpoint string            `json:"from_checkpoint,omitempty" jsonschema:"fork from this existing checkpoint instead of taking a new one"`
	BestEffort     bool              `json:"best_effort,omitempty" jsonschema:"start as many children as fit; the rest report ResourceExhausted"`
	Memory         bool              `json:"memory,omitempty" jsonschema:"gVisor only: children continue the source's processes (the source stops briefly)"`
}

// ForkChild is one child of a fork: its sandbox, or its error.
type ForkChild struct {
	Sandbox    *Sandbox `json:"sandbox,omitempty"`
	Error      string   `json:"error,omitempty"`
	ErrorClass string   `json:"error_class,omitempty" jsonschema:"NotFound, ResourceExhausted, ..."`
	StartMS    float64  `json:"start_ms"`
}

// ForkOut is the outcome of a fork: per-child results.
type ForkOut struct {
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	Captured   string      `json:"captured" jsonschema:"what the children start from: filesystem or filesystem+memory"`
	CaptureMS  float64     `json:"capture_ms" jsonschema:"how long the source was frozen"`
	TotalMS    float64     `json:"total_ms"`
	Children   []ForkChild `json:"children"`
}

func (t *tools) fork(ctx context.Context, in ForkIn) (ForkOut, error) {
	count := in.Count
	if count == 0 {
		count = 1
	}
	if count < 1 || count > MaxForkCount {
		return ForkOut{}, errInvalid("count %d: want 1 to %d", in.Count, MaxForkCount)
	}
	sb, err := t.c.Sandbox(ctx, in.Sandbox)
	if err != nil {
		return ForkOut{}, err
	}
	res, err := sb.Fork(ctx, client.ForkOptions{
		Tag: in.Tag, Count: count, Overrides: client.Overrides{Env: in.Env},
		FromCheckpoint: in.FromCheckpoint, BestEffort: in.BestEffort, Memory: in.Memory,
	})
	if err != nil {
		return ForkOut{}, err
	}
	out := ForkOut{Checkpoint: checkpointOut(res.Checkpoint), Captured: res.Captured, CaptureMS: res.CaptureMS, TotalMS: res.TotalMS,
		Children: make([]ForkChild, 0, len(res.Children))}
	for _, c := range res.Children {
		ch := ForkChild{StartMS: c.StartMS}
		if c.Sandbox != nil {
			s := sandboxOut(c.Sandbox.Info)
			ch.Sandbox = &s
		}
		if c.Err != nil {
			ch.Error, ch.ErrorClass = c.Err.Error(), errdefs.ClassName(c.Err)
		}
		out.Children = append(out.Children, ch)
	}
	return out, nil
}

// CheckpointIn is the input of checkpoint.
type CheckpointIn struct {
	Sandbox string `json:"sandbox" jsonschema:"sandbox ID or name"`
	Tag     string `json:"tag,omitempty"`
	Memory  bool   `json:"memory,omitempty" jsonschema:"gVisor only: capture memory and processes too"`
}

func (t *tools) checkpoint(ctx context.Context, in CheckpointIn) (*Checkpoint, error) {
	sb, err := t.c.Sandbox(ctx, in.Sandbox)
	if err != nil {
		return nil, err
	}
	var ck *client.Checkpoint
	if in.Memory {
		ck, err = sb.CheckpointMemory(ctx, in.Tag)
	} else {
		ck, err = sb.Checkpoint(ctx, in.Tag)
	}
	if err != nil {
		return nil, err
	}
	return checkpointOut(ck), nil
}

// ListIn is the input of list.
type ListIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"list this sandbox's checkpoints instead of the sandboxes"`
	All     bool   `json:"all,omitempty" jsonschema:"closed sandboxes too"`
}

// ListOut is sandboxes, or a sandbox's checkpoints.
type ListOut struct {
	Sandboxes   []Sandbox    `json:"sandboxes,omitempty"`
	Checkpoints []Checkpoint `json:"checkpoints,omitempty"`
}

func (t *tools) list(ctx context.Context, in ListIn) (ListOut, error) {
	if in.Sandbox != "" {
		sb, err := t.c.Sandbox(ctx, in.Sandbox)
		if err != nil {
			return ListOut{}, err
		}
		cks, err := sb.ListCheckpoints(ctx)
		if err != nil {
			return ListOut{}, err
		}
		out := ListOut{Checkpoints: make([]Checkpoint, 0, len(cks))}
		for _, c := range cks {
			out.Checkpoints = append(out.Checkpoints, *checkpointOut(c))
		}
		return out, nil
	}
	infos, err := t.c.ListSandboxes(ctx, in.All)
	if err != nil {
		return ListOut{}, err
	}
	out := ListOut{Sandboxes: make([]Sandbox, 0, len(infos))}
	for _, i := range infos {
		out.Sandboxes = append(out.Sandboxes, sandboxOut(i))
	}
	return out, nil
}

// RestoreIn is the input of restore.
type RestoreIn struct {
	Checkpoint string            `json:"checkpoint" jsonschema:"checkpoint ID (ck-...)"`
	Name       string            `json:"name,omitempty" jsonschema:"name of the new sandbox"`
	Env        map[string]string `json:"env,omitempty" jsonschema:"environment merged over the checkpoint's"`
	Cwd        string            `json:"cwd,omitempty"`
}

func (t *tools) restore(ctx context.Context, in RestoreIn) (Sandbox, error) {
	if in.Checkpoint == "" {
		return Sandbox{}, errInvalid("checkpoint is required")
	}
	sb, err := t.c.RestoreSnapshot(ctx, in.Checkpoint, client.Overrides{Name: in.Name, Env: in.Env, Cwd: in.Cwd}, nil)
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOut(sb.Info), nil
}

// CloseIn is the input of close.
type CloseIn struct {
	Sandbox string `json:"sandbox" jsonschema:"sandbox ID or name"`
}

// CloseOut names the sandbox closed.
type CloseOut struct {
	Closed string `json:"closed"`
}

func (t *tools) close(ctx context.Context, in CloseIn) (CloseOut, error) {
	sb, err := t.c.Sandbox(ctx, in.Sandbox)
	if err != nil {
		return CloseOut{}, err
	}
	if err := sb.Close(ctx); err != nil {
		return CloseOut{}, err
	}
	return CloseOut{Closed: sb.ID}, nil
}
