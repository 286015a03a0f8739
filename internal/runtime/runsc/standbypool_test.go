package runsc

// The standby pool's own logic, without runsc and without root: the
// standby is this test binary, which speaks standby.patch's protocol and
// then, as its "command", prints its arguments (or waits forever on
// "hang", or exits with "exit=N").

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const fakeRunscEnv = "FORKBOX_TEST_FAKE_RUNSC"

func TestMain(m *testing.M) {
	if os.Getenv(fakeRunscEnv) == "1" {
		fakeStandbyMain()
	}
	os.Exit(m.Run())
}

// fakeStandbyMain is the test binary as a standby (standby.patch's protocol,
// without its checks: the patch's own tests have those).
func fakeStandbyMain() {
	fd, err := strconv.Atoi(os.Getenv(standbyEnv))
	if err != nil {
		os.Exit(125)
	}
	unix.Write(fd, []byte{standbyReady})
	buf, oob := make([]byte, standbyMax), make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
	if err != nil || n == 0 {
		os.Exit(0)
	}
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	fds, _ := unix.ParseUnixRights(&msgs[0])
	for i, f := range fds {
		unix.Dup3(f, i, 0)
		unix.Close(f)
	}
	unix.Write(fd, []byte{standbyGo})
	unix.Close(fd)
	args := strings.Split(string(buf[:n-1]), "\x00")
	for _, a := range args {
		if a == "hang" {
			time.Sleep(time.Hour) // until killed
		}
		if c, ok := strings.CutPrefix(a, "exit="); ok {
			code, _ := strconv.Atoi(c)
			os.Exit(code)
		}
	}
	fmt.Print(strings.Join(args, " "))
	os.Exit(0)
}

func newFakePool(t *testing.T, n int) *standbyPool {
	t.Helper()
	t.Setenv(fakeRunscEnv, "1")
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := newStandbyPool(bin, n, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	t.Cleanup(p.close)
	return p
}

// runFake runs args through p with stdout on a pipe and returns whether a
// standby ran them, the error and the output.
func runFake(ctx context.Context, p *standbyPool, args ...string) (bool, error, string) {
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	r, w, _ := os.Pipe()
	defer r.Close()
	ran, err := p.run(ctx, args, null, w, w)
	w.Close()
	out, _ := io.ReadAll(r)
	return ran, err, string(out)
}

// Many callers at once: each command runs in a standby at most once, with
// its own stdio, or is left to the caller; close leaves nothing running.
func TestStandbyPoolConcurrent(t *testing.T) {
	p := newFakePool(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.awaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	const callers = 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	hits := 0
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := fmt.Sprintf("run --bundle b%d id%d", i, i)
			ran, err, out := runFake(ctx, p, strings.Fields(want)...)
			if !ran {
				if out != "" {
					t.Errorf("caller %d: not run, yet output %q", i, out)
				}
				return
			}
			if err != nil || out != want {
				t.Errorf("caller %d: %v, output %q, want %q", i, err, out, want)
			}
			mu.Lock()
			hits++
			mu.Unlock()
		}()
	}
	wg.Wait()
	s := p.stats()
	if hits == 0 || s.Hits != int64(hits) || s.Hits+s.Misses != callers {
		t.Errorf("%d ran; stats %+v, want hits + misses = %d, at least one hit", hits, s, callers)
	}
	p.close()
	if s := p.stats(); s.Ready != 0 || s.Pending != 0 {
		t.Errorf("stats after close %+v, want none ready or pending", s)
	}
	if ran, _, _ := runFake(ctx, p, "after", "close"); ran {
		t.Error("a standby ran a command after close")
	}
}

// The command's exit status comes back, and a caller that goes away kills
// its command.
func TestStandbyPoolExitAndCancel(t *testing.T) {
	p := newFakePool(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p.awaitReady(ctx)
	ran, err, _ := runFake(ctx, p, "exit=3")
	var code int
	if ee, ok := err.(interface{ ExitCode() int }); ok {
		code = ee.ExitCode()
	}
	if !ran || code != 3 {
		t.Errorf("ran %v, err %v: want exit status 3", ran, err)
	}

	pid, err := p.awaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ran, err, _ = runFake(cctx, p, "hang")
	}()
	// Cancel once the command is in the standby: its pid no longer waits.
	for p.stats().Hits < 2 {
		select {
		case <-done:
			t.Fatal("hang returned before it was canceled")
		case <-time.After(time.Millisecond):
		}
	}
	ccancel()
	<-done
	if !ran || err == nil {
		t.Errorf("ran %v, err %v: want the command killed", ran, err)
	}
	if alive(pid) {
		t.Errorf("standby %d still there after its caller went", pid)
	}
	// A caller gone already gets no standby.
	if ran, _, _ := runFake(cctx, p, "x"); ran {
		t.Error("a canceled caller's command ran in a standby")
	}
}
