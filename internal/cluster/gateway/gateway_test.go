package gateway

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Names a caller gives become object names only when they are DNS labels
// short enough for their children, and not of an ID's form.
func TestValidName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"box", true}, {"my-job-1", true}, {strings.Repeat("a", 50), true},
		{"", false}, {"Box", false}, {"a/b", false}, {"../etc", false}, {"a.b", false}, {"-a", false},
		{strings.Repeat("a", 51), false}, {"sb-123", false}, {"ck-1", false}, {"a\x00b", false},
	} {
		err := validName("sandbox", tc.name)
		if (err == nil) != tc.ok || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("validName(%q): got %v, want ok=%v (else InvalidArgument)", tc.name, err, tc.ok)
		}
	}
	if err := checkRef("sandbox", strings.Repeat("x", maxRef+1)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("an oversized reference: got %v, want InvalidArgument", err)
	}
}

// A page token round-trips, and anything else is InvalidArgument.
func TestPageToken(t *testing.T) {
	k, err := parsePageToken(pageToken(1234, "box-1"))
	if err != nil || k.at != 1234 || k.name != "box-1" {
		t.Fatalf("round trip: got %+v, %v", k, err)
	}
	for _, tok := range []string{"x", "bm90LW91cnM", pageToken(1, "a") + "=", strings.Repeat("A", 600)} {
		if _, err := parsePageToken(tok); !errdefs.IsInvalidArgument(err) {
			t.Errorf("token %q: got %v, want InvalidArgument", tok, err)
		}
	}
	sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "box-2", CreationTimestamp: metav1.NewTime(time.UnixMilli(1234))}}
	if !(&pageKey{at: 1234, name: "box-1"}).before(sb) || (&pageKey{at: 1234, name: "box-3"}).before(sb) {
		t.Fatal("page keys order by creation, then name")
	}
}

// A sandbox that will not start says why with the class the daemon would
// give: the placer's no-fit is ResourceExhausted (a checkpoint on no
// node with room FailedPrecondition), the node's failed create keeps its
// class, a lost node is Unavailable; one on its way is no failure.
func TestStartFailure(t *testing.T) {
	cond := func(typ, reason, msg string, ok bool) []metav1.Condition {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		return []metav1.Condition{{Type: typ, Status: st, Reason: reason, Message: msg}}
	}
	for _, tc := range []struct {
		name   string
		status fbv1.SandboxStatus
		node   string
		want   error
	}{
		{"pending", fbv1.SandboxStatus{Phase: fbv1.PhasePending}, "", nil},
		{"creating", fbv1.SandboxStatus{Phase: fbv1.PhaseCreating}, "n1", nil},
		{"no fit", fbv1.SandboxStatus{Phase: fbv1.PhasePending, Conditions: cond(fbv1.ConditionScheduled, "Unschedulable", "no node fits (n1: full (1/1 slots)): resource exhausted", false)}, "", errdefs.ErrResourceExhausted},
		{"checkpoint elsewhere", fbv1.SandboxStatus{Phase: fbv1.PhasePending, Conditions: cond(fbv1.ConditionScheduled, "CheckpointUnavailable", "checkpoint c not on any node with room (n1: full)", false)}, "", errdefs.ErrFailedPrecondition},
		{"session's node down", fbv1.SandboxStatus{Phase: fbv1.PhasePending, Conditions: cond(fbv1.ConditionScheduled, "NodeUnavailable", "node n1, which holds the session's ledger, is not ready", false)}, "", errdefs.ErrUnavailable},
		{"waiting for source", fbv1.SandboxStatus{Phase: fbv1.PhasePending, Conditions: cond(fbv1.ConditionScheduled, "WaitingForSource", "checkpoint c is not ready", false)}, "", nil},
		{"image missing", fbv1.SandboxStatus{Phase: fbv1.PhaseFailed, Conditions: cond(fbv1.ConditionReady, "CreateFailedNotFound", "image x: not found", false)}, "n1", errdefs.ErrNotFound},
		{"bad input", fbv1.SandboxStatus{Phase: fbv1.PhaseFailed, Conditions: cond(fbv1.ConditionReady, "CreateFailedInvalidArgument", "memory lots", false)}, "n1", errdefs.ErrInvalidArgument},
		{"gone from the ledger", fbv1.SandboxStatus{Phase: fbv1.PhaseFailed, Conditions: cond(fbv1.ConditionReady, "LocalSandboxGone", "gone", false)}, "n1", errdefs.ErrFailedPrecondition},
		{"lost", fbv1.SandboxStatus{Phase: fbv1.PhaseLost}, "n1", errdefs.ErrUnavailable},
	} {
		sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: fbv1.SandboxSpec{NodeName: tc.node}, Status: tc.status}
		err := startFailure(sb)
		if (err == nil) != (tc.want == nil) || (tc.want != nil && errdefs.Class(err) != tc.want) {
			t.Errorf("%s: got %v (%s), want class %v", tc.name, err, errdefs.ClassName(err), tc.want)
		}
	}
}

// A create's fields become the object's, bounded, or the call is refused.
func TestCreateFields(t *testing.T) {
	var spec fbv1.SandboxSpec
	err := fill(&spec, &v1.Resources{Cpu: "0.5", Memory: "256Mi", Disk: "0", Pids: 64}, map[string]string{"B": "2", "A": "1"}, "", []string{"10.0.0.0/8"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Resources.CPU.MilliValue() != 500 || spec.Resources.Memory.Value() != 256<<20 || spec.Resources.Disk.Value() != 0 ||
		*spec.Resources.Pids != 64 || spec.Env[0].Name != "A" || spec.Egress.Allow[0] != "10.0.0.0/8" {
		t.Fatalf("got %+v", spec)
	}
	bad := []func() error{
		func() error { return fill(&spec, &v1.Resources{Memory: "lots"}, nil, "", nil, nil) },
		func() error { return fill(&spec, &v1.Resources{Cpu: "-1"}, nil, "", nil, nil) },
		func() error { return fill(&spec, &v1.Resources{Pids: -1}, nil, "", nil, nil) },
		func() error { return fill(&spec, nil, nil, "sometimes", nil, nil) },
		func() error { return fill(&spec, nil, nil, "allow", make([]string, maxEgress+1), nil) },
		func() error {
			env := map[string]string{}
			for i := range maxEnv + 1 {
				env[strings.Repeat("x", i+1)] = ""
			}
			return fill(&spec, nil, env, "", nil, nil)
		},
		func() error { _, err := runtimeOf("docker"); return err },
		func() error { return noOnTimeout("hibernate", "crun") },
		func() error { return noOnTimeout("later", "") },
	}
	for i, f := range bad {
		if err := f(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("bad input %d: got %v, want InvalidArgument", i, err)
		}
	}
	if err := noOnTimeout("hibernate", "gvisor"); !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "cluster mode") {
		t.Errorf("on_timeout hibernate: got %v, want NotImplemented naming cluster mode", err)
	}
}

// The gateway refuses to start with the nodes' token as its callers'.
func TestOptionsTokens(t *testing.T) {
	o := Options{Config: &rest.Config{}, Addr: "127.0.0.1:0", Token: "same", NodeToken: "same"}
	if err := o.setDefaults(); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "must differ") {
		t.Fatalf("the same token: got %v, want InvalidArgument", err)
	}
	o.NodeToken = "other"
	if err := o.setDefaults(); err != nil || o.Namespace != "default" {
		t.Fatalf("distinct tokens: got %v, namespace %q", err, o.Namespace)
	}
}

// A handover comes from a warm pool only when nothing in it differs from
// a member: no name, resources, env, cwd or egress (a timeout is set
// after the handover).
func TestPoolable(t *testing.T) {
	q := resource.MustParse("1")
	for _, tc := range []struct {
		name string
		mod  func(*fbv1.SandboxSpec)
		sb   string
		want bool
	}{
		{"nothing", func(*fbv1.SandboxSpec) {}, "", true},
		{"a name", func(*fbv1.SandboxSpec) {}, "mine", false},
		{"cpu", func(s *fbv1.SandboxSpec) { s.Resources.CPU = &q }, "", false},
		{"env", func(s *fbv1.SandboxSpec) { s.Env = []fbv1.EnvVar{{Name: "A"}} }, "", false},
		{"cwd", func(s *fbv1.SandboxSpec) { s.WorkingDir = "/x" }, "", false},
		{"egress", func(s *fbv1.SandboxSpec) { s.Egress = &fbv1.Egress{Mode: "none"} }, "", false},
	} {
		sb := &fbv1.Sandbox{Spec: fbv1.SandboxSpec{State: fbv1.StateRunning}}
		tc.mod(&sb.Spec)
		if got := poolable(sb, tc.sb); got != tc.want {
			t.Errorf("%s: got poolable %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A sandbox's checkpoints list in the order its node captured them, even
// when their objects were made within one second (creation times are whole
// seconds, and names are random): the MCP suite's fork-then-checkpoint
// listed them the other way round when both fell in one second. A page
// token continues after the last item in that order.
func TestCheckpointsOldestFirst(t *testing.T) {
	sec := time.Unix(1_700_000_000, 0)
	ck := func(name string, captured time.Duration, phase fbv1.CheckpointPhase) fbv1.Checkpoint {
		c := fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(sec)}}
		c.Status.Phase = phase
		if captured >= 0 {
			c.Status.CapturedAt = &metav1.MicroTime{Time: sec.Add(captured)}
		}
		return c
	}
	in := []fbv1.Checkpoint{
		ck("box-ck-zz", 900*time.Millisecond, fbv1.CheckpointReady),
		ck("box-ck-aa", 400*time.Millisecond, fbv1.CheckpointReady),
		ck("fork-box-x", 100*time.Millisecond, fbv1.CheckpointReady),
		ck("box-ck-mm", 500*time.Millisecond, fbv1.CheckpointPending),
	}
	var got []string
	for _, c := range readyOldestFirst(in, metav1.NewTime(sec)) {
		got = append(got, c.Name)
	}
	if want := []string{"fork-box-x", "box-ck-aa", "box-ck-zz"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// The key a page token carries puts the next page after the last item.
	last := ck("box-ck-aa", 400*time.Millisecond, fbv1.CheckpointReady)
	k, err := parsePageToken(pageToken(capturedAt(&last).UnixMicro(), last.Name))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ck    fbv1.Checkpoint
		after bool
	}{{ck("fork-box-x", 100*time.Millisecond, ""), false}, {last, false}, {ck("box-ck-zz", 900*time.Millisecond, ""), true}} {
		if got := k.beforeAt(capturedAt(&c.ck).UnixMicro(), c.ck.Name); got != c.after {
			t.Errorf("%s after the page: got %v, want %v", c.ck.Name, got, c.after)
		}
	}
	// One captured before nodes recorded the time orders by its creation.
	old := ck("old", -1, fbv1.CheckpointReady)
	if !capturedAt(&old).Equal(sec) {
		t.Errorf("capturedAt without status: got %v, want the creation time %v", capturedAt(&old), sec)
	}
}
