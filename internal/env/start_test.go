package env

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// A /proc/net/tcp with a listener on 127.0.0.1:8080 (0x1F90) and a
// connection from port 8081 (0x1F91), which is not listening.
const procNet8080 = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 10 0
   1: 0100007F:1F91 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 10 0
`

func withStart(d Definition, s StartCommand) Definition {
	d.Start = &s
	return d
}

func TestStartCommandSnapshotIsAMemoryCheckpoint(t *testing.T) {
	f, m := newFake(t)
	f.setProcNet(procNet8080)
	plain, _, err := m.Build(bg, def("srv", "a", "b"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var phases []string
	st, built, err := m.Build(bg, withStart(def("srv", "a", "b"), StartCommand{Run: "httpd -p 8080", ReadyPort: 8080}), false,
		func(p Progress) { phases = append(phases, p.Phase) })
	if err != nil || !built {
		t.Fatalf("build with a start command: %v (built %v)", err, built)
	}
	if st.Rec.Hash == plain.Rec.Hash {
		t.Errorf("the start command is not part of the definition's hash")
	}
	ck, err := f.st.GetCheckpoint(bg, st.Rec.Checkpoint)
	if err != nil || ck.Kind != "filesystem+memory" {
		t.Fatalf("the snapshot: %+v, %v; want a memory checkpoint", ck, err)
	}
	// The steps were not run again: the builder started from the snapshot
	// of both steps, and only the start command ran in it.
	if f.builders[1] != plain.Rec.Checkpoint || st.Rec.CachedSteps != 2 {
		t.Errorf("builder from %q (cached %d), want the steps' snapshot %q", f.builders[1], st.Rec.CachedSteps, plain.Rec.Checkpoint)
	}
	if got := strings.Join(f.execs, ","); got != "a,b,start:httpd -p 8080" {
		t.Errorf("commands: got %s", got)
	}
	if got := strings.Join(phases, ","); !strings.Contains(got, "start,ready,checkpoint") {
		t.Errorf("progress phases: %s", got)
	}
	// A different start command is a different snapshot.
	st2, built, err := m.Build(bg, withStart(def("srv", "a", "b"), StartCommand{Run: "httpd -p 8080 -v", ReadyPort: 8080}), false, nil)
	if err != nil || !built || st2.Rec.Hash == st.Rec.Hash || st2.Rec.Checkpoint == st.Rec.Checkpoint {
		t.Errorf("changed start command: built %v, hash %s -> %s, %v", built, st.Rec.Hash, st2.Rec.Hash, err)
	}
	// Sandboxes are handed over from the memory checkpoint.
	res, err := m.Sandbox(bg, nil, "srv", Overrides{})
	if err != nil || res.Sandbox.FromCheckpoint != st2.Rec.Checkpoint {
		t.Errorf("handover: %+v, %v", res, err)
	}
}

func TestStartCommandReadiness(t *testing.T) {
	f, m := newFake(t)
	// The ready command fails twice, then passes.
	tries := 0
	f.onExec = func(_ context.Context, shell string) (int, error) {
		if shell == "check" {
			if tries++; tries < 3 {
				return 1, nil
			}
		}
		return 0, nil
	}
	f.setProcNet(procNet8080)
	probe := withStart(def("probe"), StartCommand{Run: "srv", ReadyPort: 8080, ReadyCommand: "check"})
	if _, _, err := m.Build(bg, probe, false, nil); err != nil || tries != 3 {
		t.Fatalf("ready port and command: %v after %d tries of the command, want 3", err, tries)
	}

	// Nothing listens on 8081: the build fails with FailedPrecondition
	// once the timeout has passed, saying what it waited for.
	t0 := time.Now()
	_, _, err := m.Build(bg, withStart(def("slow"), StartCommand{Run: "srv", ReadyPort: 8081, ReadyTimeout: 200 * time.Millisecond}), false, nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "8081") {
		t.Errorf("never ready: got %v, want FailedPrecondition naming the port", err)
	}
	if time.Since(t0) < 200*time.Millisecond {
		t.Errorf("gave up after %s, before the timeout", time.Since(t0))
	}
	if rec, _ := f.st.GetEnvironment(bg, "slow"); rec == nil || rec.State != store.EnvFailed {
		t.Errorf("after a readiness timeout: %+v", rec)
	}
	for _, sb := range f.live(t) {
		t.Errorf("sandbox %s (%s) left running", sb.ID, sb.Name)
	}
}

func TestStartCommandChecks(t *testing.T) {
	_, m := newFake(t)
	for _, tc := range []struct {
		name  string
		s     StartCommand
		class func(error) bool
	}{
		{"no command", StartCommand{Run: " "}, errdefs.IsInvalidArgument},
		{"bad port", StartCommand{Run: "x", ReadyPort: 70000}, errdefs.IsInvalidArgument},
		{"negative port", StartCommand{Run: "x", ReadyPort: -1}, errdefs.IsInvalidArgument},
		{"timeout too long", StartCommand{Run: "x", ReadyTimeout: time.Hour}, errdefs.IsInvalidArgument},
		{"negative timeout", StartCommand{Run: "x", ReadyTimeout: -time.Second}, errdefs.IsInvalidArgument},
		{"too long", StartCommand{Run: strings.Repeat("x", maxStartBytes+1)}, errdefs.IsResourceExhausted},
	} {
		if _, _, err := m.Build(bg, withStart(def("bad"), tc.s), false, nil); !tc.class(err) {
			t.Errorf("%s: got %v, want an error of the right class", tc.name, err)
		}
	}
}

func TestListeningParsesHostileTables(t *testing.T) {
	v6 := "  sl  local_address                         remote_address                        st\n" +
		"   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0\n"
	for _, tc := range []struct {
		name  string
		table string
		port  int
		want  bool
	}{
		{"listener", procNet8080, 8080, true},
		{"connected, not listening", procNet8080, 8081, false},
		{"ipv6 listener", v6, 80, true},
		{"empty", "", 80, false},
		{"garbage", "0A 0A 0A\n::::: x 0A\nsl :zz y 0A\n", 80, false},
		{"port out of range", "0: 0:1FFFFF 0:0 0A\n", 0x1FFFFF & 0xFFFF, false},
		{"line too long", strings.Repeat("x", 10000) + "\n" + procNet8080, 8080, false},
	} {
		if got := listening([]byte(tc.table), tc.port); got != tc.want {
			t.Errorf("%s: listening on %d = %v, want %v", tc.name, tc.port, got, tc.want)
		}
	}
}
