package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testimage"
)

// runtimes are the runtimes the conformance tests run on.
var runtimes = []string{"gvisor", "crun"}

// curRuntime is the runtime clientOpts asks for.
var curRuntime = "gvisor"

func clientOpts() client.CreateOptions {
	return client.CreateOptions{Image: env.image, Runtime: curRuntime, Resources: client.Resources{CPU: "1", Memory: "256Mi"}}
}

// gvisorOpts is clientOpts on gVisor, for what only gVisor does (memory
// checkpoints, hibernation).
func gvisorOpts() client.CreateOptions {
	o := clientOpts()
	o.Runtime = "gvisor"
	return o
}

// forEachRuntime runs f as a subtest per runtime: the one conformance
// suite that every runtime passes.
func forEachRuntime(t *testing.T, f func(t *testing.T)) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			curRuntime = rt
			defer func() { curRuntime = "gvisor" }()
			f(t)
		})
	}
}

func TestCreateFromRegistryAndArchives(t *testing.T) {
	ctx := context.Background()
	base := testimage.BusyboxT(t)
	img := testimage.WithFilesT(t, base, map[string]string{"etc/flavour": "registry\n"})
	ref := testimage.PushT(t, img, "e2e/flavoured:v1")
	pulled, err := env.c.PullImage(ctx, ref, true, nil)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	dockerImg := testimage.WithFilesT(t, base, map[string]string{"etc/flavour": "docker-archive\n"})
	path := filepath.Join(t.TempDir(), "docker.tar")
	if err := testimage.WriteDockerArchive(dockerImg, "e2e.local/docker:v1", path); err != nil {
		t.Fatal(err)
	}
	imported, err := env.c.ImportImage(ctx, path, "", nil)
	if err != nil {
		t.Fatalf("import docker-archive: %v", err)
	}
	for _, c := range []struct{ image, want string }{{pulled.Name, "registry"}, {imported.Name, "docker-archive"}} {
		o := clientOpts()
		o.Image = c.image
		sb := newSandbox(t, o)
		if got := strings.TrimSpace(mustSh(t, sb, "cat /etc/flavour")); got != c.want {
			t.Errorf("image %s: /etc/flavour = %q, want %q", c.image, got, c.want)
		}
	}
	list, err := env.c.ListImages(ctx)
	if err != nil || len(list) < 3 {
		t.Fatalf("ListImages = %d images, %v; want at least 3", len(list), err)
	}
}

func TestExec(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		sb := newSandbox(t, clientOpts())
		exits := []struct {
			cmd    string
			code   int
			signal string
		}{
			{"true", 0, ""},
			{"exit 3", 3, ""},
			{"kill -9 $$", 137, "SIGKILL"},
			{"kill -TERM $$", 143, "SIGTERM"},
		}
		for _, c := range exits {
			_, _, res := sh(t, sb, c.cmd)
			if res.ExitCode != c.code || res.Signal != c.signal {
				t.Errorf("%q: got exit %d signal %q, want %d %q", c.cmd, res.ExitCode, res.Signal, c.code, c.signal)
			}
		}
		out, errs, _ := sh(t, sb, "echo to-out; echo to-err >&2")
		if out != "to-out\n" || errs != "to-err\n" {
			t.Errorf("stdout %q stderr %q; want them apart", out, errs)
		}

		// Streaming: the first line reaches the caller while the command
		// runs. The command waits (30 s at most) for a file that the test
		// writes once the first line has reached it, and says whether it
		// came.
		w := &signalWriter{want: "first\n", seen: make(chan struct{})}
		type result struct {
			res *client.ExecResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo first; for i in $(seq 1500); do [ -e /tmp/gate ] && break; sleep 0.02; done; " +
				"[ -e /tmp/gate ] && echo streamed || echo buffered", Stdout: w})
			done <- result{res, err}
		}()
		var r result
		select {
		case <-w.seen:
			if err := sb.WriteFile(ctx, "/tmp/gate", nil, 0o600); err != nil {
				t.Fatal(err)
			}
			r = <-done
		case r = <-done: // it ended before its first line reached the test
		}
		if r.err != nil || r.res.ExitCode != 0 {
			t.Fatalf("streaming exec: %v %+v", r.err, r.res)
		}
		if got := w.String(); got != "first\nstreamed\n" {
			t.Errorf("streamed output %q, want %q: the first line reached the caller only once the command ended", got, "first\nstreamed\n")
		}

		// argv, env, cwd, stdin.
		var o strings.Builder
		res, err := sb.Exec(ctx, client.ExecOptions{Argv: []string{"sh", "-c", `echo "$GREETING $(pwd)"; cat`},
			Env: map[string]string{"GREETING": "hello"}, Cwd: "/tmp", Stdin: []byte("from-stdin"), Stdout: &o})
		if err != nil || res.ExitCode != 0 || o.String() != "hello /tmp\nfrom-stdin" {
			t.Errorf("argv/env/cwd/stdin: got %q, %v, %+v", o.String(), err, res)
		}

		// Timeout kills the command (the bound is the hang it guards
		// against: the 120 s sleep).
		res, err = sb.Exec(ctx, client.ExecOptions{Shell: "sleep 120", Timeout: 300 * time.Millisecond})
		if err != nil || !res.TimedOut || res.Duration > 30*time.Second {
			t.Errorf("timeout: got %+v, %v; want timed out", res, err)
		}

		// Background process keeps running after its exec returns.
		pid, err := sb.Start(ctx, client.ExecOptions{Shell: "sleep 300"})
		if err != nil || pid <= 1 {
			t.Fatalf("background start: pid %d, %v", pid, err)
		}
		if out := mustSh(t, sb, fmt.Sprintf("kill -0 %d && echo alive", pid)); out != "alive\n" {
			t.Errorf("background process %d not alive: %q", pid, out)
		}

		// Files.
		if err := sb.WriteFile(ctx, "/work/dir/hello.txt", []byte("hi there"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := sb.ReadFile(ctx, "/work/dir/hello.txt"); err != nil || string(got) != "hi there" {
			t.Errorf("ReadFile = %q, %v", got, err)
		}
		files, err := sb.ListFiles(ctx, "/work/dir")
		if err != nil || len(files) != 1 || files[0].Name != "hello.txt" || files[0].Size != 8 || files[0].Mode&0o777 != 0o600 {
			t.Errorf("ListFiles = %v, %v", files, err)
		}
		if out := mustSh(t, sb, "cat /work/dir/hello.txt"); out != "hi there" {
			t.Errorf("file written by the API, read by a command: %q", out)
		}

		// The ledger has every exec, with exit codes.
		evs, err := sb.Events(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var finished []float64
		for _, e := range evs {
			if e.Type == "exec.finished" {
				if c, ok := e.Data["exit_code"].(float64); ok {
					finished = append(finished, c)
				}
			}
		}
		if len(finished) < len(exits) || finished[1] != 3 || finished[2] != 137 {
			t.Errorf("ledger exec.finished exit codes = %v", finished)
		}
	})
}

func TestIsolation(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		o := clientOpts()
		o.Name = "iso-a"
		a := newSandbox(t, o)
		o.Name = "iso-b"
		b := newSandbox(t, o)

		// Own hostname.
		if got := strings.TrimSpace(mustSh(t, a, "hostname")); got != "iso-a" {
			t.Errorf("hostname = %q, want iso-a", got)
		}
		// No host processes: the sandbox sees its agent and its own commands.
		ps := mustSh(t, a, "ps -o pid,comm")
		if strings.Contains(ps, "forkbox") && !strings.Contains(ps, "agent") || strings.Contains(ps, "runsc") || strings.Contains(ps, "systemd") {
			t.Errorf("host processes visible:\n%s", ps)
		}
		if n := len(strings.Split(strings.TrimSpace(ps), "\n")); n > 6 {
			t.Errorf("sandbox sees %d processes:\n%s", n, ps)
		}
		// No route to host services: a listener on the host's bridge address.
		ln, err := net.Listen("tcp", gateway+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan struct{}, 1)
		go func() {
			if c, err := ln.Accept(); err == nil {
				accepted <- struct{}{}
				c.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		if _, _, res := sh(t, a, fmt.Sprintf("nc -w 2 %s %d </dev/null", gateway, port)); res.ExitCode == 0 {
			t.Errorf("egress none: the sandbox connected to the host at %s:%d", gateway, port)
		}
		select {
		case <-accepted:
			t.Errorf("egress none: the host accepted a connection from the sandbox")
		default:
		}
		// No route to another sandbox (b listens on a port).
		if _, err := b.Start(context.Background(), client.ExecOptions{Shell: "nc -l -p 9000"}); err != nil {
			t.Fatal(err)
		}
		// Once it listens (port 9000 is 2328 in hex; 0A is LISTEN; busybox
		// nc listens on IPv6's any address where it can): the kernel's table
		// has no event to wait on, so b polls it.
		if _, _, res := sh(t, b, "for i in $(seq 300); do cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q ':2328 0*:0000 0A' && exit 0; sleep 0.1; done; exit 1"); res.ExitCode != 0 {
			t.Fatal("nc -l -p 9000 in sandbox b did not listen within 30 s")
		}
		if _, _, res := sh(t, a, fmt.Sprintf("nc -w 2 %s 9000 </dev/null", b.Info.Ip)); res.ExitCode == 0 {
			t.Errorf("sandbox a reached sandbox b at %s:9000", b.Info.Ip)
		}

		// Writes are private: a file written in a is not in b.
		mustSh(t, a, "echo secret > /root/a.txt && echo changed > /etc/motd")
		if out, _, res := sh(t, b, "cat /root/a.txt; cat /etc/motd"); res.ExitCode == 0 || strings.Contains(out, "secret") || strings.Contains(out, "changed") {
			t.Errorf("sandbox b sees a's writes: %q", out)
		}
	})
}

func TestMemoryLimit(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		o := clientOpts()
		o.Resources.Memory = "64Mi"
		sb := newSandbox(t, o)
		_, _, res := sh(t, sb, "dd if=/dev/zero of=/dev/null bs=300M count=1")
		if !res.OOMKilled || res.Signal != "SIGKILL" {
			t.Errorf("allocating 300M under 64Mi: got %+v, want killed for memory", res)
		}
		// The sandbox (and its agent) survive.
		if out := mustSh(t, sb, "echo still-here"); out != "still-here\n" {
			t.Errorf("after the kill: %q", out)
		}
		// Allocating under the limit is fine.
		if _, errs, res := sh(t, sb, "dd if=/dev/zero of=/dev/null bs=16M count=1"); res.ExitCode != 0 {
			t.Errorf("allocating 16M under 64Mi: %+v %s", res, errs)
		}
	})
}

func TestResourceLimitsReachTheCgroup(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		o := clientOpts()
		o.Resources = client.Resources{CPU: "0.5", Memory: "128Mi", Pids: 100}
		sb := newSandbox(t, o)
		checkCgroupLimits(t, sb.ID, 50000, 100)
		if curRuntime == "gvisor" {
			// Its boot ran with a raised quota; the tenant sees the limit
			// in the sandbox's own cgroupfs (scripts/gvisor/cpu-limit.patch).
			if q := strings.TrimSpace(mustSh(t, sb, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us")); q != "50000" {
				t.Errorf("the sandbox's cgroupfs shows a CPU quota of %s, want the limit 50000", q)
			}
		}
	})
}

func TestCloseLeavesNothing(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		sb, err := env.c.CreateSandbox(ctx, clientOpts())
		if err != nil {
			t.Fatal(err)
		}
		mustSh(t, sb, "echo x > /root/x; sleep 300 &")
		if _, err := sb.Start(ctx, client.ExecOptions{Shell: "sleep 600"}); err != nil {
			t.Fatal(err)
		}
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
		checkNoLeftovers(t, sb.ID)
		if err := sb.Refresh(ctx); err != nil || sb.Info.State != "closed" {
			t.Errorf("after close: state %v, %v; want closed", sb.Info.GetState(), err)
		}
		evs, _ := sb.Events(ctx)
		if len(evs) == 0 || evs[len(evs)-1].Type != "sandbox.closed" {
			t.Errorf("ledger does not end with sandbox.closed: %+v", evs)
		}
	})
}

// TestAddressReuse: an address freed by a close is given to the next
// sandbox at once; the host must reach the new one, not the old one's MAC.
func TestAddressReuse(t *testing.T) {
	ctx := context.Background()
	var ips []string
	for i := 0; i < 3; i++ {
		sb, err := env.c.CreateSandbox(ctx, clientOpts())
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		mustSh(t, sb, "true")
		ips = append(ips, sb.Info.Ip)
		if err := sb.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ips[0] != ips[1] || ips[1] != ips[2] {
		t.Logf("addresses were not reused (%v): the test proves less", ips)
	}
}
