package e2b

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/forkbox/forkbox/api/e2b/process"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
)

// Bounds of the process table.
const (
	// maxProcs bounds the processes started through the endpoint that run
	// at once in one sandbox.
	maxProcs = 64
	// subBuffer is the events a stream attached to a process may lag by;
	// subStall how long the process's output waits for a stream that lags
	// more before that stream is cut (the process itself keeps running).
	subBuffer = 64
	subStall  = 30 * time.Second
)

// proc is one process started through the endpoint: its output fans out
// to the streams attached to it (Start's, and any Connect's).
type proc struct {
	sandbox string
	pid     uint32
	tag     string
	config  *process.ProcessConfig
	// stdin is the write end of the process's input (nil: it has none);
	// pty is set for a process on a terminal.
	stdin *io.PipeWriter
	pty   *daemon.PtySession

	mu    sync.Mutex
	subs  map[*sub]struct{}
	ended bool

	counted bool // in its table's running count (the table's mu)
}

// sub is one stream attached to a process.
type sub struct {
	ch chan *process.ProcessEvent
	// cut is closed when the stream lagged past subStall and was dropped;
	// gone when the stream's reader left (its client went away).
	cut, gone         chan struct{}
	cutOnce, goneOnce sync.Once
}

func newSub() *sub {
	return &sub{ch: make(chan *process.ProcessEvent, subBuffer), cut: make(chan struct{}), gone: make(chan struct{})}
}

// leave detaches the stream from p: its reader is done with it.
func (s *sub) leave(p *proc) {
	p.detach(s)
	s.goneOnce.Do(func() { close(s.gone) })
}

// attach adds a stream; false when the process has ended.
func (p *proc) attach(s *sub) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return false
	}
	p.subs[s] = struct{}{}
	return true
}

func (p *proc) detach(s *sub) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// publish sends ev to every attached stream, waiting up to subStall for
// one that lags; the end event closes them all.
func (p *proc) publish(ev *process.ProcessEvent, end bool) {
	p.mu.Lock()
	subs := make([]*sub, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	if end {
		p.ended = true
		p.subs = nil
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		default:
			t := time.NewTimer(subStall)
			select {
			case s.ch <- ev:
			case <-s.gone:
			case <-t.C:
				p.detach(s)
				s.cutOnce.Do(func() { close(s.cut) })
			}
			t.Stop()
		}
		if end {
			close(s.ch)
		}
	}
}

// output is an io.Writer publishing what it gets as data events.
type output struct {
	p      *proc
	stderr bool
	pty    bool
}

func (o output) Write(b []byte) (int, error) {
	d := &process.ProcessEvent_DataEvent{}
	c := append([]byte(nil), b...)
	switch {
	case o.pty:
		d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: c}
	case o.stderr:
		d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: c}
	default:
		d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: c}
	}
	o.p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}, false)
	return len(b), nil
}

// procTable holds the running processes of every sandbox.
type procTable struct {
	mu    sync.Mutex
	procs map[string]map[uint32]*proc // sandbox id → pid → process
	// running counts the processes added and not yet removed, per sandbox,
	// and pending those being started (for maxProcs): not the pids, which
	// the sandbox's agent reports, and a hostile one repeats.
	running, pending map[string]int
}

func newProcTable() *procTable {
	return &procTable{procs: map[string]map[uint32]*proc{}, running: map[string]int{}, pending: map[string]int{}}
}

// reserve takes one of a sandbox's maxProcs slots; release gives it back.
func (t *procTable) reserve(sandbox string) (release func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running[sandbox]+t.pending[sandbox] >= maxProcs {
		return nil, fmt.Errorf("sandbox %s runs %d processes started through the E2B endpoint, the most it may: %w", sandbox, maxProcs, errdefs.ErrResourceExhausted)
	}
	t.pending[sandbox]++
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			if t.pending[sandbox]--; t.pending[sandbox] <= 0 {
				delete(t.pending, sandbox)
			}
			t.mu.Unlock()
		})
	}, nil
}

// add counts p as running; its pid finds it from now on (a process that
// had the same pid is still counted, until it is removed, but no longer
// found).
func (t *procTable) add(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !p.counted {
		p.counted = true
		t.running[p.sandbox]++
	}
	if t.procs[p.sandbox] == nil {
		t.procs[p.sandbox] = map[uint32]*proc{}
	}
	t.procs[p.sandbox][p.pid] = p
}

func (t *procTable) remove(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.counted {
		p.counted = false
		if t.running[p.sandbox]--; t.running[p.sandbox] <= 0 {
			delete(t.running, p.sandbox)
		}
	}
	if m := t.procs[p.sandbox]; m[p.pid] == p {
		delete(m, p.pid)
		if len(m) == 0 {
			delete(t.procs, p.sandbox)
		}
	}
}

// find returns a sandbox's process by pid or tag.
func (t *procTable) find(sandbox string, sel *process.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p := t.procs[sandbox][s.Pid]; p != nil {
			return p, nil
		}
		return nil, fmt.Errorf("process with pid %d not found (forkbox knows the processes started through the E2B endpoint): %w", s.Pid, errdefs.ErrNotFound)
	case *process.ProcessSelector_Tag:
		for _, p := range t.procs[sandbox] {
			if p.tag != "" && p.tag == s.Tag {
				return p, nil
			}
		}
		return nil, fmt.Errorf("process with tag %.64q not found: %w", s.Tag, errdefs.ErrNotFound)
	}
	return nil, fmt.Errorf("a process selector (pid or tag) is required: %w", errdefs.ErrInvalidArgument)
}

func (t *procTable) list(sandbox string) []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*proc, 0, len(t.procs[sandbox]))
	for _, p := range t.procs[sandbox] {
		out = append(out, p)
	}
	return out
}

// dropSandbox forgets a sandbox's processes (it is being killed: their
// streams end as their execs fail, and each one's remove uncounts it).
func (t *procTable) dropSandbox(sandbox string) {
	t.mu.Lock()
	delete(t.procs, sandbox)
	t.mu.Unlock()
}
