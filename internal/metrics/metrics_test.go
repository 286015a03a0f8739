package metrics

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
	"github.com/forkbox/forkbox/internal/store"
)

type fakeLister []*store.Sandbox

func (f fakeLister) ListSandboxes(context.Context, bool) ([]*store.Sandbox, error) { return f, nil }

// fakeCgroups writes v1 cpuacct and memory files for each id below root.
func fakeCgroups(t *testing.T, root, parent string, ids ...string) {
	t.Helper()
	for i, id := range ids {
		for file, val := range map[string]string{
			filepath.Join(root, "cpuacct", parent, id, "cpuacct.usage"):        fmt.Sprint((i + 1) * 1e9),
			filepath.Join(root, "memory", parent, id, "memory.usage_in_bytes"): fmt.Sprint((i + 1) << 20),
		} {
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte(val+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func sandboxesFixture() fakeLister {
	t0 := time.Unix(1700000000, 0)
	return fakeLister{
		{ID: "sb-a", State: store.StateRunning, CreatedAt: t0},
		{ID: "sb-b", State: store.StatePaused, CreatedAt: t0.Add(time.Second)},
		{ID: "sb-c", State: store.StateRunning, CreatedAt: t0.Add(2 * time.Second), Pool: "base"},
		{ID: "sb-d", State: store.StateFailed, CreatedAt: t0.Add(3 * time.Second)},
	}
}

// TestLint checks every forkbox metric name and help text against the
// Prometheus conventions (promlint).
func TestLint(t *testing.T) {
	root := t.TempDir()
	fakeCgroups(t, root, "fb", "sb-a", "sb-b", "sb-c")
	m := New(Options{Sandboxes: sandboxesFixture(), CgroupParent: "fb", CgroupRoot: root})
	// Touch every vector so that each has a series to lint.
	m.done("/forkbox.v1.SandboxService/Fork", time.Millisecond, nil)
	m.done("/forkbox.v1.SandboxService/GetSandbox", time.Millisecond, errdefs.ErrNotFound)
	m.unary(nil, &v1.ForkResponse{Children: []*v1.ForkChild{{Sandbox: &v1.Sandbox{}}}})
	m.unary(nil, &v1.EnvironmentSandboxResponse{FromPool: true})
	collectors := map[string]prometheus.Collector{
		"requests": m.requests, "errors": m.errors, "latency": m.latency, "forkSize": m.forkSize,
		"forkKids": m.forkKids, "poolHits": m.poolHits, "poolMisses": m.poolMisses, "envBuilds": m.envBuilds,
		"sandboxes": &sandboxCollector{o: Options{Sandboxes: sandboxesFixture(), CgroupParent: "fb", CgroupRoot: root, MaxSandboxSeries: 10}},
	}
	for name, c := range collectors {
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s: %s", name, p.Metric, p.Text)
		}
	}
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "forkbox_") {
			t.Errorf("registry: %s: %s", p.Metric, p.Text)
		}
	}
}

// TestSandboxSeries checks the scrape-time gauges and the per-sandbox cap.
func TestSandboxSeries(t *testing.T) {
	root := t.TempDir()
	fakeCgroups(t, root, "fb", "sb-a", "sb-b", "sb-c")
	c := &sandboxCollector{o: Options{Sandboxes: sandboxesFixture(), CgroupParent: "fb", CgroupRoot: root, MaxSandboxSeries: 2}}
	want := `
# HELP forkbox_sandbox_cpu_seconds_total CPU time used by a live sandbox's cgroup (series exist only while the sandbox lives; capped).
# TYPE forkbox_sandbox_cpu_seconds_total counter
forkbox_sandbox_cpu_seconds_total{sandbox="sb-a"} 1
forkbox_sandbox_cpu_seconds_total{sandbox="sb-b"} 2
# HELP forkbox_sandbox_memory_bytes Memory charged to a live sandbox's cgroup (series exist only while the sandbox lives; capped).
# TYPE forkbox_sandbox_memory_bytes gauge
forkbox_sandbox_memory_bytes{sandbox="sb-a"} 1.048576e+06
forkbox_sandbox_memory_bytes{sandbox="sb-b"} 2.097152e+06
# HELP forkbox_sandbox_series_dropped Live sandboxes left without CPU and memory series because of the cap.
# TYPE forkbox_sandbox_series_dropped gauge
forkbox_sandbox_series_dropped 1
# HELP forkbox_pool_sandboxes Sandboxes waiting in environment warm pools.
# TYPE forkbox_pool_sandboxes gauge
forkbox_pool_sandboxes 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "forkbox_sandbox_cpu_seconds_total",
		"forkbox_sandbox_memory_bytes", "forkbox_sandbox_series_dropped", "forkbox_pool_sandboxes"); err != nil {
		t.Error(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "forkbox_sandboxes" {
			continue
		}
		for _, s := range mf.GetMetric() {
			got[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
		}
	}
	for st, n := range map[string]float64{"running": 2, "paused": 1, "failed": 1, "creating": 0, "hibernated": 0} {
		if got[st] != n {
			t.Errorf("forkbox_sandboxes{state=%q}: got %v, want %v", st, got[st], n)
		}
	}
}

// fakeSandboxes answers a few calls the interceptor has something to say about.
type fakeSandboxes struct {
	forkboxv1connect.UnimplementedSandboxServiceHandler
}

func (fakeSandboxes) CreateSandbox(context.Context, *connect.Request[v1.CreateSandboxRequest]) (*connect.Response[v1.CreateSandboxResponse], error) {
	return connect.NewResponse(&v1.CreateSandboxResponse{Sandbox: &v1.Sandbox{Id: "sb-1"}}), nil
}

func (fakeSandboxes) GetSandbox(_ context.Context, req *connect.Request[v1.GetSandboxRequest]) (*connect.Response[v1.GetSandboxResponse], error) {
	return nil, fmt.Errorf("sandbox %q: %w", req.Msg.Sandbox, errdefs.ErrNotFound)
}

func (fakeSandboxes) ListSandboxes(context.Context, *connect.Request[v1.ListSandboxesRequest]) (*connect.Response[v1.ListSandboxesResponse], error) {
	panic("a bug")
}

func (fakeSandboxes) Fork(context.Context, *connect.Request[v1.ForkRequest]) (*connect.Response[v1.ForkResponse], error) {
	return connect.NewResponse(&v1.ForkResponse{Children: []*v1.ForkChild{
		{Sandbox: &v1.Sandbox{Id: "sb-2"}}, {Sandbox: &v1.Sandbox{Id: "sb-3"}}, {Error: "no slot", ErrorClass: "ResourceExhausted"},
	}}), nil
}

func (fakeSandboxes) Exec(_ context.Context, req *connect.Request[v1.ExecRequest], st *connect.ServerStream[v1.ExecResponse]) error {
	if req.Msg.Sandbox == "" {
		return fmt.Errorf("a sandbox is required: %w", errdefs.ErrInvalidArgument)
	}
	return st.Send(&v1.ExecResponse{Event: &v1.ExecResponse_Exit{Exit: &v1.ExecExit{}}})
}

type fakeEnvs struct {
	forkboxv1connect.UnimplementedEnvironmentServiceHandler
}

func (fakeEnvs) EnvironmentSandbox(_ context.Context, req *connect.Request[v1.EnvironmentSandboxRequest]) (*connect.Response[v1.EnvironmentSandboxResponse], error) {
	return connect.NewResponse(&v1.EnvironmentSandboxResponse{Sandbox: &v1.Sandbox{}, FromPool: req.Msg.Name == "pooled",
		Built: req.Msg.Name == "fresh"}), nil
}

func (fakeEnvs) BuildEnvironment(_ context.Context, req *connect.Request[v1.BuildEnvironmentRequest], st *connect.ServerStream[v1.BuildProgress]) error {
	phase := "cached"
	if req.Msg.Definition.GetName() == "fresh" {
		phase = "create"
	}
	if err := st.Send(&v1.BuildProgress{Phase: phase}); err != nil {
		return err
	}
	return st.Send(&v1.BuildProgress{Phase: "done"})
}

// toConnect stands for the server's error interceptor, outside ours.
type toConnect struct{}

func (toConnect) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, errconnect.ToConnect(err)
	}
}
func (toConnect) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}
func (toConnect) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return errconnect.ToConnect(next(ctx, conn))
	}
}

// TestInterceptor drives real Connect handlers over HTTP and checks what
// the interceptor counted.
func TestInterceptor(t *testing.T) {
	m := New(Options{})
	opts := []connect.HandlerOption{connect.WithInterceptors(toConnect{}, m.Interceptor()),
		connect.WithRecover(func(context.Context, connect.Spec, http.Header, any) error {
			return connect.NewError(connect.CodeInternal, errors.New("internal error"))
		})}
	mux := http.NewServeMux()
	mux.Handle(forkboxv1connect.NewSandboxServiceHandler(fakeSandboxes{}, opts...))
	mux.Handle(forkboxv1connect.NewEnvironmentServiceHandler(fakeEnvs{}, opts...))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	sc := forkboxv1connect.NewSandboxServiceClient(srv.Client(), srv.URL, connect.WithProtoJSON())
	ec := forkboxv1connect.NewEnvironmentServiceClient(srv.Client(), srv.URL)
	ctx := context.Background()

	if _, err := sc.CreateSandbox(ctx, connect.NewRequest(&v1.CreateSandboxRequest{})); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := sc.GetSandbox(ctx, connect.NewRequest(&v1.GetSandboxRequest{Sandbox: "nope"})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("GetSandbox: got %v, want NotFound", err)
		}
	}
	if _, err := sc.ListSandboxes(ctx, connect.NewRequest(&v1.ListSandboxesRequest{})); connect.CodeOf(err) != connect.CodeInternal {
		t.Fatalf("ListSandboxes (panics): got %v, want Internal", err)
	}
	if _, err := sc.Fork(ctx, connect.NewRequest(&v1.ForkRequest{Sandbox: "sb-1", Count: 3})); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []string{"sb-1", ""} {
		st, err := sc.Exec(ctx, connect.NewRequest(&v1.ExecRequest{Sandbox: sb}))
		if err != nil {
			t.Fatal(err)
		}
		for st.Receive() {
		}
		st.Close()
	}
	for _, name := range []string{"pooled", "fresh", "other"} {
		if _, err := ec.EnvironmentSandbox(ctx, connect.NewRequest(&v1.EnvironmentSandboxRequest{Name: name})); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"fresh", "cached"} {
		st, err := ec.BuildEnvironment(ctx, connect.NewRequest(&v1.BuildEnvironmentRequest{Definition: &v1.EnvironmentDefinition{Name: name}}))
		if err != nil {
			t.Fatal(err)
		}
		for st.Receive() {
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}

	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"requests CreateSandbox", testutil.ToFloat64(m.requests.WithLabelValues("SandboxService/CreateSandbox")), 1},
		{"requests GetSandbox", testutil.ToFloat64(m.requests.WithLabelValues("SandboxService/GetSandbox")), 2},
		{"errors GetSandbox NotFound", testutil.ToFloat64(m.errors.WithLabelValues("SandboxService/GetSandbox", "NotFound")), 2},
		{"errors ListSandboxes Internal (a panic)", testutil.ToFloat64(m.errors.WithLabelValues("SandboxService/ListSandboxes", "Internal")), 1},
		{"requests Exec", testutil.ToFloat64(m.requests.WithLabelValues("SandboxService/Exec")), 2},
		{"errors Exec InvalidArgument", testutil.ToFloat64(m.errors.WithLabelValues("SandboxService/Exec", "InvalidArgument")), 1},
		{"fork children ok", testutil.ToFloat64(m.forkKids.WithLabelValues("ok")), 2},
		{"fork children error", testutil.ToFloat64(m.forkKids.WithLabelValues("error")), 1},
		{"pool hits", testutil.ToFloat64(m.poolHits), 1},
		{"pool misses", testutil.ToFloat64(m.poolMisses), 2},
		{"environment builds ok", testutil.ToFloat64(m.envBuilds.WithLabelValues("ok")), 2},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	// Latency: one create, one fork, one successful exec; no checkpoint.
	for op, want := range map[string]int{"create": 1, "fork": 1, "exec": 1, "checkpoint": 0} {
		if got := histCount(t, m.latency.WithLabelValues(op).(prometheus.Metric)); got != want {
			t.Errorf("forkbox_operation_duration_seconds{operation=%q} count: got %d, want %d", op, got, want)
		}
	}
	if got := histCount(t, m.forkSize); got != 1 {
		t.Errorf("forkbox_fork_children count: got %d, want 1", got)
	}
}

func histCount(t *testing.T, c prometheus.Metric) int {
	t.Helper()
	pb := &dto.Metric{}
	if err := c.Write(pb); err != nil {
		t.Fatal(err)
	}
	return int(pb.GetHistogram().GetSampleCount())
}
