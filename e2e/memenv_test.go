package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// serverStart is a start command whose server proves when it started: the
// start command writes a fresh random value (its own start) into the page
// the server serves, then becomes the server. A sandbox in which it ran
// again would serve another value.
const serverStart = "mkdir -p /www && cat /proc/sys/kernel/random/uuid > /www/started && exec httpd -f -p 8080 -h /www"

func memEnvOpts() client.EnvironmentOptions {
	o := envOpts("mkdir -p /www && echo setup-done > /www/setup")
	o.Runtime = "gvisor"
	o.Start = &client.StartCommand{Run: serverStart, ReadyPort: 8080, ReadyTimeoutMs: 120_000}
	return o
}

// getOnce makes one HTTP request, with no retry: a server that is not
// already listening fails it.
func getOnce(t *testing.T, url string) (string, error) {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), err
}

// TestMemoryEnvironment: an environment whose setup ends with a start
// command hands over sandboxes in which its server already listens: the
// first request, made the moment the sandbox is handed over, is answered,
// by the server the builder started (the value it wrote at its start is
// the same in every sandbox). Each sandbox has an agent token of its own;
// the builder is gone.
func TestMemoryEnvironment(t *testing.T) {
	ctx := context.Background()
	const name = "e2e-memenv"
	defer env.c.DeleteEnvironment(ctx, name)
	e := env.c.Environment(name, memEnvOpts())
	var phases []string
	info, err := e.Build(ctx, func(p *client.BuildProgress) { phases = append(phases, p.Phase) })
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if got := strings.Join(phases, ","); !strings.Contains(got, "start,ready,checkpoint") {
		t.Errorf("build phases %s: no start, ready and checkpoint", got)
	}
	started := ""
	tokens := map[string]bool{}
	for i := range 2 {
		sb := envSandbox(t, e)
		body, err := getOnce(t, fmt.Sprintf("http://%s:8080/started", sb.Info.Ip))
		if err != nil {
			t.Fatalf("sandbox %d: the first request to the environment's server: %v", i, err)
		}
		if i == 0 {
			started = body
		} else if body != started {
			t.Errorf("sandbox %d: the server started at %q, sandbox 0's at %q: the start command ran again", i, body, started)
		}
		// The server is the start command's process, not a new one; it
		// was never started by an exec in this sandbox.
		if out := mustSh(t, sb.Sandbox, "ps | grep -q '[h]ttpd -f' && echo running"); out != "running\n" {
			t.Errorf("sandbox %d: httpd: %q", i, out)
		}
		if evs, _ := sb.Events(ctx); hasEvent(evs, "exec.started") && countEvents(evs, "exec.started") > 1 {
			t.Errorf("sandbox %d: execs before ours: %v", i, types(evs))
		}
		if host := strings.TrimSpace(mustSh(t, sb.Sandbox, "hostname")); host != sb.Info.Name {
			t.Errorf("sandbox %d: hostname %q, want its own %q", i, host, sb.Info.Name)
		}
		tok := agentToken(t, sb.ID)
		if tokens[tok] {
			t.Errorf("sandbox %d has another sandbox's agent token", i)
		}
		tokens[tok] = true
	}
	if strings.TrimSpace(started) == "" {
		t.Errorf("the server served an empty start value")
	}
	// The builder was closed by its memory checkpoint.
	list, err := env.c.ListSandboxes(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if strings.HasPrefix(s.Name, "build-"+name) {
			t.Errorf("builder %s (%s) is still there after the build", s.Id, s.State)
		}
	}
	// Built once: a second handle of the same definition does not build.
	if again := envSandbox(t, env.c.Environment(name, memEnvOpts())); again.Built {
		t.Errorf("the same definition built again")
	}
	_ = info
}

// TestMemoryEnvironmentPool: a pool of 2 sandboxes restored from the memory
// snapshot ahead of demand; a hand-over from it answers at once.
func TestMemoryEnvironmentPool(t *testing.T) {
	ctx := context.Background()
	const name = "e2e-memenv-pool"
	defer env.c.DeleteEnvironment(ctx, name)
	o := memEnvOpts()
	o.PoolSize = 2
	e := env.c.Environment(name, o)
	if _, err := e.Build(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitEnv(t, e, "a pool of 2 ready", func(i *client.EnvironmentInfo) bool { return i.PoolReady == 2 })
	sb := envSandbox(t, e)
	if !sb.FromPool {
		t.Errorf("a hand-over with a full pool did not come from the pool")
	}
	if body, err := getOnce(t, fmt.Sprintf("http://%s:8080/setup", sb.Info.Ip)); err != nil || body != "setup-done\n" {
		t.Errorf("pooled sandbox: the first request: %q, %v", body, err)
	}
	// The pool refills behind it.
	waitEnv(t, e, "the pool refilled to 2", func(i *client.EnvironmentInfo) bool { return i.PoolReady == 2 })
}

// TestMemoryEnvironmentNeedsGVisor: a start command on crun is refused
// before anything is built, naming the runtime.
func TestMemoryEnvironmentNeedsGVisor(t *testing.T) {
	ctx := context.Background()
	const name = "e2e-memenv-crun"
	defer env.c.DeleteEnvironment(ctx, name)
	o := memEnvOpts()
	o.Runtime = "crun"
	before := countSandboxes(t)
	_, err := env.c.Environment(name, o).Build(ctx, nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "crun") {
		t.Errorf("start command under crun: got %v, want FailedPrecondition naming crun", err)
	}
	if n := countSandboxes(t); n != before {
		t.Errorf("a refused definition started %d sandboxes", n-before)
	}
}

func countEvents(evs []client.Event, typ string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// signalWriter collects output and closes seen once it contains want.
type signalWriter struct {
	mu   sync.Mutex
	buf  strings.Builder
	want string
	seen chan struct{}
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestMemoryForkExecInFlight: an exec streaming in the source while it is
// memory-forked completes with all its output (the source is only paused
// for the fork), or fails with the retryable class Unavailable (the project
// has no Aborted class); it never hangs. The fork reports the source's downtime.
func TestMemoryForkExecInFlight(t *testing.T) {
	ctx := context.Background()
	src := newSandbox(t, clientOpts())
	const ticks = 30
	out := &signalWriter{want: "tick 3\n", seen: make(chan struct{})}
	type result struct {
		res *client.ExecResult
		err error
	}
	done := make(chan result, 1)
	ectx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	go func() {
		res, err := src.Exec(ectx, client.ExecOptions{Shell: fmt.Sprintf("for i in $(seq 1 %d); do echo tick $i; sleep 0.05; done", ticks), Stdout: out})
		done <- result{res, err}
	}()
	select {
	case <-out.seen:
	case r := <-done:
		t.Fatalf("the exec ended before the fork: %+v %v", r.res, r.err)
	case <-ectx.Done():
		t.Fatal("the exec printed nothing in 3 minutes")
	}
	fork, err := src.Fork(ctx, client.ForkOptions{Memory: true})
	if err != nil {
		t.Fatalf("memory fork with an exec in flight: %v", err)
	}
	closeAll(t, fork.Sandboxes())
	if fork.SourceDowntimeMS <= 0 {
		t.Errorf("the fork reports a source downtime of %v ms", fork.SourceDowntimeMS)
	}
	t.Logf("source downtime %.1f ms, capture %.1f ms", fork.SourceDowntimeMS, fork.CaptureMS)
	var r result
	select {
	case r = <-done:
	case <-ectx.Done():
		t.Fatalf("the exec in flight during the fork hung; its output: %q", out.String())
	}
	switch {
	case r.err == nil:
		var want strings.Builder
		for i := 1; i <= ticks; i++ {
			fmt.Fprintf(&want, "tick %d\n", i)
		}
		if r.res.ExitCode != 0 || out.String() != want.String() {
			t.Errorf("the exec across the fork: exit %d, output %q; want exit 0 and every tick once, in order", r.res.ExitCode, out.String())
		}
	case errdefs.IsUnavailable(r.err):
		t.Logf("the exec across the fork failed with the retryable class Unavailable: %v", r.err)
	default:
		t.Errorf("the exec across the fork: got %v, want success or Unavailable", r.err)
	}
	// The source runs on.
	if got := mustSh(t, src, "echo ok"); got != "ok\n" {
		t.Errorf("the source after the fork: %q", got)
	}
}

// TestMemoryEnvironmentCLI: the README's commands: an environment file with
// a start command, `env build -f`, then `create --environment` hands over a
// sandbox whose server answers the first request.
func TestMemoryEnvironmentCLI(t *testing.T) {
	ctx := context.Background()
	const name = "e2e-memenv-cli"
	defer env.c.DeleteEnvironment(ctx, name)
	file := filepath.Join(t.TempDir(), "web.json")
	def := fmt.Sprintf(`{"name": %q, "image": %q, "runtime": "gvisor",
 "setup": ["mkdir -p /www && echo hello > /www/index.html"],
 "start": {"run": "exec httpd -f -p 8080 -h /www", "ready_port": 8080, "ready_timeout": "120s"}}`, name, env.image)
	if err := os.WriteFile(file, []byte(def), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := cli(t, "env", "build", "-f", file); code != 0 {
		t.Fatalf("env build: exit %d, %q %q", code, out, errs)
	}
	out, errs, code := cli(t, "--json", "create", "--environment", name)
	var res struct {
		Sandbox client.Info `json:"sandbox"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("create --environment: exit %d, %q %q", code, out, errs)
	}
	defer func() {
		if sb, err := env.c.Sandbox(ctx, res.Sandbox.Id); err == nil {
			sb.Close(ctx)
		}
	}()
	if body, err := getOnce(t, fmt.Sprintf("http://%s:8080/index.html", res.Sandbox.Ip)); err != nil || body != "hello\n" {
		t.Errorf("the first request to the environment's server: %q, %v", body, err)
	}
	// A bad start in the file is refused before anything is built.
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`{"name": %q, "image": %q, "start": {"ready_port": 8080}}`, name+"-bad", env.image)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := cli(t, "env", "build", "-f", file); code == 0 || !strings.Contains(errs, "start") {
		t.Errorf("env build of a start without a command: exit %d, %q", code, errs)
	}
}
