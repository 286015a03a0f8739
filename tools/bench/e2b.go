package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/api/e2b/process"
	"github.com/forkbox/forkbox/api/e2b/process/processconnect"
	"github.com/forkbox/forkbox/client"
)

// E2BResult is the e2b section: the same operations through the E2B-
// compatible endpoint (`serve --e2b`, as E2B's SDKs call it: REST JSON and
// envd's Connect services in JSON) and through forkbox's own API, in
// alternation on the daemon's default runtime. The overheads are p50
// differences.
type E2BResult struct {
	Runtime   string `json:"runtime"`
	ForkCount int    `json:"fork_count"`
	// CreateFirstRun is create, then the first `true` to its exit.
	CreateFirstRunE2B     Summary `json:"create_first_run_e2b"`
	CreateFirstRunForkbox Summary `json:"create_first_run_forkbox"`
	// Exec is one `true` to its exit in a running sandbox (E2B:
	// process.Start of /bin/bash -l -c true, as commands.run; forkbox: Exec
	// of the same command line, sh -l -c true in the bench's image).
	ExecE2B     Summary `json:"exec_e2b"`
	ExecForkbox Summary `json:"exec_forkbox"`
	// Fork is fork(count) to every child ready (E2B: POST /fork; forkbox:
	// Fork), memory forks on gVisor both ways.
	ForkE2B          Summary `json:"fork_e2b"`
	ForkForkbox      Summary `json:"fork_forkbox"`
	CreateOverheadMS float64 `json:"create_first_run_overhead_ms"`
	ExecOverheadMS   float64 `json:"exec_overhead_ms"`
	ForkOverheadMS   float64 `json:"fork_overhead_ms"`
}

// e2bForkCount is the children of each fork of the e2b section.
const e2bForkCount = 3

// goalE2BOverheadMS is the compatibility layer's cost per call.
const goalE2BOverheadMS = 5

// e2bClient calls the endpoint as E2B's SDKs do.
type e2bClient struct {
	url, key string
	hc       *http.Client
}

func (e *e2bClient) rest(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", e.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode >= 300 {
		return fmt.Errorf("e2b %s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

type e2bSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

func (e *e2bClient) create(ctx context.Context, template string) (e2bSandbox, error) {
	var sb e2bSandbox
	err := e.rest(ctx, "POST", "/v2/sandboxes", map[string]any{"templateID": template, "timeout": 600}, &sb)
	return sb, err
}

func (e *e2bClient) kill(ctx context.Context, id string) error {
	return e.rest(ctx, "DELETE", "/sandboxes/"+id, nil, nil)
}

func (e *e2bClient) fork(ctx context.Context, id string, n int) ([]e2bSandbox, error) {
	var res []struct {
		Sandbox *e2bSandbox `json:"sandbox"`
		Error   *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := e.rest(ctx, "POST", "/sandboxes/"+id+"/fork", map[string]any{"count": n, "timeout": 600}, &res); err != nil {
		return nil, err
	}
	var out []e2bSandbox
	var ferr error
	for _, r := range res {
		if r.Sandbox != nil {
			out = append(out, *r.Sandbox)
		} else if r.Error != nil {
			ferr = fmt.Errorf("e2b fork child: %s", r.Error.Message)
		}
	}
	return out, ferr
}

// run starts cmd as commands.run does (/bin/bash -l -c, which runs
// /bin/sh in the bench's busybox image) and waits for its end.
func (e *e2bClient) run(ctx context.Context, sb e2bSandbox, cmd string) (int32, error) {
	pc := processconnect.NewProcessClient(e.hc, e.url, connect.WithProtoJSON())
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}})
	req.Header().Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header().Set("X-Access-Token", sb.EnvdAccessToken)
	stream, err := pc.Start(ctx, req)
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	for stream.Receive() {
		if end := stream.Msg().GetEvent().GetEnd(); end != nil {
			return end.ExitCode, nil
		}
	}
	if err := stream.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("e2b run %q in %s: no end event", cmd, sb.SandboxID)
}

func (e *e2bClient) runTrue(ctx context.Context, sb e2bSandbox) (float64, error) {
	t := time.Now()
	code, err := e.run(ctx, sb, "true")
	if err == nil && code != 0 {
		err = fmt.Errorf("e2b true in %s: exit %d", sb.SandboxID, code)
	}
	return ms(time.Since(t)), err
}

// shTrue runs, through forkbox's API, what commands.run("true") runs (in
// the bench's image, which has no bash): sh -l -c true.
func shTrue(ctx context.Context, sb *client.Sandbox) (float64, error) {
	t := time.Now()
	res, err := sb.Exec(ctx, client.ExecOptions{Argv: []string{"/bin/sh", "-l", "-c", "true"}})
	d := ms(time.Since(t))
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("sh -l -c true in %s: exit %d", sb.ID, res.ExitCode)
	}
	return d, err
}

// measureE2B runs the e2b section on the daemon's default runtime.
func (b *bench) measureE2B(ctx context.Context, e *e2bClient) (E2BResult, error) {
	rt := "gvisor"
	r := E2BResult{Runtime: rt, ForkCount: e2bForkCount}
	var ce, cf []float64
	for i := range b.opts.reps + 1 { // the first is a warm-up
		t := time.Now()
		sb, err := e.create(ctx, b.image)
		if err != nil {
			return r, err
		}
		_, err = e.runTrue(ctx, sb)
		d := ms(time.Since(t))
		e.kill(context.WithoutCancel(ctx), sb.SandboxID)
		if err != nil {
			return r, err
		}
		t = time.Now()
		fb, err := b.create(ctx, rt)
		if err != nil {
			return r, err
		}
		_, err = shTrue(ctx, fb)
		df := ms(time.Since(t))
		b.close(ctx, fb)
		if err != nil {
			return r, err
		}
		if i > 0 {
			ce, cf = append(ce, d), append(cf, df)
		}
	}
	r.CreateFirstRunE2B, r.CreateFirstRunForkbox = summarize(ce), summarize(cf)

	// One sandbox, reached both ways.
	sb, err := e.create(ctx, b.image)
	if err != nil {
		return r, err
	}
	defer e.kill(context.WithoutCancel(ctx), sb.SandboxID)
	fb, err := b.c.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		return r, err
	}
	var xe, xf []float64
	for i := range b.opts.execReps + 1 {
		de, err := e.runTrue(ctx, sb)
		if err != nil {
			return r, err
		}
		df, err := shTrue(ctx, fb)
		if err != nil {
			return r, err
		}
		if i > 0 {
			xe, xf = append(xe, de), append(xf, df)
		}
	}
	r.ExecE2B, r.ExecForkbox = summarize(xe), summarize(xf)

	var fe, ff []float64
	for range b.opts.reps {
		t := time.Now()
		kids, err := e.fork(ctx, sb.SandboxID, e2bForkCount)
		d := ms(time.Since(t))
		for _, k := range kids {
			e.kill(context.WithoutCancel(ctx), k.SandboxID)
		}
		if err != nil {
			return r, err
		}
		t = time.Now()
		res, err := fb.Fork(ctx, client.ForkOptions{Count: e2bForkCount, Memory: rt == "gvisor"})
		df := ms(time.Since(t))
		if err != nil {
			return r, err
		}
		var children []*client.Sandbox
		for _, c := range res.Children {
			if c.Err != nil {
				err = c.Err
			}
			children = append(children, c.Sandbox)
		}
		b.close(ctx, children...)
		if err != nil {
			return r, err
		}
		fe, ff = append(fe, d), append(ff, df)
	}
	r.ForkE2B, r.ForkForkbox = summarize(fe), summarize(ff)
	r.CreateOverheadMS = r.CreateFirstRunE2B.Median - r.CreateFirstRunForkbox.Median
	r.ExecOverheadMS = r.ExecE2B.Median - r.ExecForkbox.Median
	r.ForkOverheadMS = r.ForkE2B.Median - r.ForkForkbox.Median
	return r, nil
}

func (r *E2BResult) print(w io.Writer) {
	fmt.Fprintf(w, "7. E2B-compatible endpoint (serve --e2b) vs forkbox's own API, alternating, on %s\n", r.Runtime)
	fmt.Fprintln(w, "what\tthrough E2B\tforkbox API\toverhead p50\t")
	fmt.Fprintf(w, "create + first run of true (n=%d)\t%s\t%s\t%s\t\n", r.CreateFirstRunE2B.N, pp(r.CreateFirstRunE2B), pp(r.CreateFirstRunForkbox), num(r.CreateOverheadMS))
	fmt.Fprintf(w, "run true in a running sandbox (n=%d)\t%s\t%s\t%s\t\n", r.ExecE2B.N, pp(r.ExecE2B), pp(r.ExecForkbox), num(r.ExecOverheadMS))
	fmt.Fprintf(w, "fork, %d children ready (n=%d)\t%s\t%s\t%s\t\n", r.ForkCount, r.ForkE2B.N, pp(r.ForkE2B), pp(r.ForkForkbox), num(r.ForkOverheadMS))
	fmt.Fprintln(w)
}
