package gateway

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// A write step becomes a shell command that a POSIX shell runs to write
// exactly those bytes with that mode, whatever the path and content
// hold (quotes, $(...), backslashes, %, NUL and high bytes), and is read
// back as the step it came from.
func TestWriteStepShell(t *testing.T) {
	var shells []string
	for _, sh := range []string{"/bin/sh", "/usr/bin/dash", "/usr/bin/busybox"} {
		if _, err := os.Stat(sh); err == nil {
			shells = append(shells, sh)
		}
	}
	if len(shells) == 0 {
		t.Skip("no POSIX shell here")
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	for _, tc := range []struct {
		path    string
		content []byte
		mode    uint32
	}{
		{"app/cfg.json", []byte(`{"a":1}`), 0},
		{"we'ird $(touch pwned) `touch pwned2` \"q\"/f %s\\n", []byte("it's 100% \\n $(touch pwned3)\n"), 0o600},
		{"bin/all", all, 0o755},
		{"empty", nil, 0o4711},
	} {
		cmd, err := writeCommand(tc.path, tc.content, tc.mode)
		if err != nil {
			t.Fatalf("%q: %v", tc.path, err)
		}
		st, ok := writeStep(cmd)
		want := tc.mode
		if want == 0o644 {
			want = 0
		}
		if !ok || st.WritePath != tc.path || !bytes.Equal(st.WriteContent, tc.content) || st.WriteMode != want {
			t.Fatalf("%q: read back as %v (%v), want the step", tc.path, st, ok)
		}
		for _, sh := range shells {
			dir := t.TempDir()
			args := []string{"-c", cmd}
			if strings.HasSuffix(sh, "busybox") {
				args = append([]string{"sh"}, args...)
			}
			c := exec.Command(sh, args...)
			c.Dir = dir
			if out, err := c.CombinedOutput(); err != nil {
				t.Fatalf("%s %q: %v: %s", sh, tc.path, err, out)
			}
			got, err := os.ReadFile(filepath.Join(dir, tc.path))
			if err != nil || !bytes.Equal(got, tc.content) {
				t.Fatalf("%s %q: wrote %q (%v), want %q", sh, tc.path, got, err, tc.content)
			}
			fi, _ := os.Stat(filepath.Join(dir, tc.path))
			m := tc.mode
			if m == 0 {
				m = 0o644
			}
			if perm := uint32(fi.Mode().Perm()); perm != m&0o777 {
				t.Fatalf("%s %q: mode %o, want %o", sh, tc.path, perm, m&0o777)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), "pwned") {
					t.Fatalf("%s %q: the path or content ran a command", sh, tc.path)
				}
			}
		}
	}
	// Commands that are not of the form stay commands.
	for _, cmd := range []string{"echo hi", `p='x'; mkdir -p -- "$(dirname -- "$p")" && printf '\9' > "$p" && chmod 0644 "$p"`,
		`p='x'; mkdir -p -- "$(dirname -- "$p")" && printf '%s' > "$p" && chmod 0644 "$p"`} {
		if st, ok := writeStep(cmd); ok {
			t.Errorf("%q read as a write step %v", cmd, st)
		}
	}
}

// A definition becomes a spec and reads back the same; what the
// Environment object cannot hold is refused as InvalidArgument naming
// cluster mode, and oversized ones as ResourceExhausted.
func TestEnvironmentSpec(t *testing.T) {
	d := &v1.EnvironmentDefinition{Name: "py", Image: "busybox", Runtime: "crun", Cwd: "/app", Env: map[string]string{"B": "2", "A": "1"},
		Resources: &v1.Resources{Cpu: "1", Memory: "256Mi", Pids: 64}, MaxAgeSeconds: 3600, PoolSize: 2,
		Steps: []*v1.SetupStep{{Run: "echo hi > /root/hi"}, {WritePath: "/app/cfg.json", WriteContent: []byte(`{"a":1}`)}}}
	spec, err := specOf(d)
	if err != nil {
		t.Fatal(err)
	}
	e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Name: "py"}, Spec: spec}
	back := definitionOf(e)
	back.Resources.Disk = ""
	if !proto.Equal(back, d) {
		t.Fatalf("read back %v, want %v", back, d)
	}
	if again, _ := specOf(d); again.Hash() != spec.Hash() {
		t.Fatal("one definition, two hashes")
	}
	d.PoolSize = 3
	if other, _ := specOf(d); other.PoolSize != 3 || other.Hash() != spec.Hash() {
		t.Fatalf("pool size %d: spec's %d, hash %s; want 3 and the hash unchanged (%s): the pool is not what is built", d.PoolSize, other.PoolSize, other.Hash(), spec.Hash())
	}
	d.PoolSize = 2
	for _, tc := range []struct {
		mod   func(*v1.EnvironmentDefinition)
		class error
		says  string
	}{
		{func(d *v1.EnvironmentDefinition) { d.Start = &v1.StartCommand{Run: "srv"} }, errdefs.ErrInvalidArgument, "cluster mode"},
		{func(d *v1.EnvironmentDefinition) { d.Egress = "none" }, errdefs.ErrInvalidArgument, "cluster mode"},
		{func(d *v1.EnvironmentDefinition) { d.SetupHash = "abc" }, errdefs.ErrInvalidArgument, "not both"},
		{func(d *v1.EnvironmentDefinition) { d.Steps, d.SetupHash = nil, strings.Repeat("a", 129) }, errdefs.ErrInvalidArgument, "at most 128"},
		{func(d *v1.EnvironmentDefinition) { d.PoolSize = 33 }, errdefs.ErrInvalidArgument, "pool size"},
		{func(d *v1.EnvironmentDefinition) { d.PoolSize = -1 }, errdefs.ErrInvalidArgument, "pool size"},
		{func(d *v1.EnvironmentDefinition) { d.Name = "Py_1" }, errdefs.ErrInvalidArgument, "name"},
		{func(d *v1.EnvironmentDefinition) { d.Name = "sb-1" }, errdefs.ErrInvalidArgument, "name"},
		{func(d *v1.EnvironmentDefinition) { d.Image = "" }, errdefs.ErrInvalidArgument, "image"},
		{func(d *v1.EnvironmentDefinition) { d.Runtime = "kata" }, errdefs.ErrInvalidArgument, "runtime"},
		{func(d *v1.EnvironmentDefinition) { d.MaxAgeSeconds = -1 }, errdefs.ErrInvalidArgument, "negative"},
		{func(d *v1.EnvironmentDefinition) { d.Resources.Memory = "lots" }, errdefs.ErrInvalidArgument, "memory"},
		{func(d *v1.EnvironmentDefinition) { d.Steps = append(d.Steps, &v1.SetupStep{}) }, errdefs.ErrInvalidArgument, "one of them"},
		{func(d *v1.EnvironmentDefinition) {
			d.Steps = append(d.Steps, &v1.SetupStep{Run: "x", WritePath: "/y"})
		}, errdefs.ErrInvalidArgument, "one of them"},
		{func(d *v1.EnvironmentDefinition) {
			d.Steps = append(d.Steps, &v1.SetupStep{WritePath: "/y", WriteContent: []byte("x"), WriteMode: 0o10000})
		}, errdefs.ErrInvalidArgument, "mode"},
		{func(d *v1.EnvironmentDefinition) {
			d.Steps = append(d.Steps, &v1.SetupStep{WritePath: "/y", WriteContent: make([]byte, 20000)})
		}, errdefs.ErrResourceExhausted, "cluster mode"},
		{func(d *v1.EnvironmentDefinition) {
			for range 70 {
				d.Steps = append(d.Steps, &v1.SetupStep{Run: "true"})
			}
		}, errdefs.ErrResourceExhausted, "at most 64"},
		{func(d *v1.EnvironmentDefinition) {
			for range 20 {
				d.Steps = append(d.Steps, &v1.SetupStep{Run: strings.Repeat("x", 60000)})
			}
		}, errdefs.ErrResourceExhausted, "cluster mode"},
	} {
		d := proto.Clone(d).(*v1.EnvironmentDefinition)
		tc.mod(d)
		_, err := specOf(d)
		if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("got %v, want %v saying %q", err, tc.class, tc.says)
		}
	}
}

// A build's outcome as the daemon's API says it: the Environment's state
// from its status, and a failed build's class from the controller's
// reason (a failed step FailedPrecondition, a node's refusal its class).
func TestEnvironmentState(t *testing.T) {
	spec := fbv1.EnvironmentSpec{Image: "busybox", Setup: []string{"true"}}
	hash := spec.Hash()
	build := "py-" + hash[:10]
	cond := func(ok metav1.ConditionStatus, reason, msg string) []metav1.Condition {
		return []metav1.Condition{{Type: fbv1.ConditionBuilt, Status: ok, Reason: reason, Message: msg}}
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		status fbv1.EnvironmentStatus
		state  string
		class  error // of the failure, if failed
	}{
		{"new", fbv1.EnvironmentStatus{}, "new", nil},
		{"building", fbv1.EnvironmentStatus{Build: build, Conditions: cond(metav1.ConditionFalse, "Building", "builder created")}, "building", nil},
		{"built", fbv1.EnvironmentStatus{Build: build, Checkpoint: build, Hash: hash, BuiltAt: &now,
			Conditions: cond(metav1.ConditionTrue, "Built", "built")}, "ready", nil},
		{"step failed", fbv1.EnvironmentStatus{Build: build, Conditions: cond(metav1.ConditionFalse, "SetupFailed", "step 1 of 1 (true): exited 1")},
			"failed", errdefs.ErrFailedPrecondition},
		{"refused by its node", fbv1.EnvironmentStatus{Build: build, Conditions: cond(metav1.ConditionFalse, "CreateFailedNotFound", `image "busybox": not found`)},
			"failed", errdefs.ErrNotFound},
		{"failed, the old build serves", fbv1.EnvironmentStatus{Build: build, Checkpoint: "py-old", Hash: "0123456789abcdef",
			Conditions: cond(metav1.ConditionFalse, "SetupFailed", "exited 1")}, "ready", errdefs.ErrFailedPrecondition},
		{"a failure of the build before a retry", fbv1.EnvironmentStatus{Build: build + "-r1", Conditions: cond(metav1.ConditionFalse, "SetupFailed", "x")},
			"building", nil},
	} {
		e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Name: "py"}, Spec: spec, Status: tc.status}
		if tc.name == "a failure of the build before a retry" {
			e.Annotations = map[string]string{fbv1.RetryAnnotation: "2"}
		}
		if got := envState(e); got.State != tc.state {
			t.Errorf("%s: state %q, want %q", tc.name, got.State, tc.state)
		}
		c := failedBuild(e, hash)
		if (c != nil) != (tc.class != nil) {
			t.Errorf("%s: failed %v, want %v", tc.name, c != nil, tc.class != nil)
			continue
		}
		if c != nil {
			if err := buildError(e, c); !errors.Is(err, tc.class) || !strings.Contains(err.Error(), c.Message) {
				t.Errorf("%s: got %v, want %v with the message", tc.name, err, tc.class)
			}
		}
	}
}
