package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	fbdaemon "github.com/forkbox/forkbox/internal/daemon"
)

// The --peers section measures, in the same run and with the same image
// and data, what a user would do without forkbox: podman `run` + `exec`,
// `exec` alone, and a fork made by `commit` + `run` of the committed
// image. podman runs with a store of its own below the bench's directory
// (removed after), cgroupfs and no network: a peer without network does
// less than a forkbox sandbox (which has its own netns, address and egress
// rules), so the ratios are conservative, and the host's firewall and
// ip_forward are left as they were.

// PeerResult is the --peers section.
type PeerResult struct {
	// Tool names the peer and its versions, e.g. "podman 4.3.1, runc 1.1.5".
	Tool       string `json:"tool"`
	OCIRuntime string `json:"oci_runtime"`
	Network    string `json:"network"`
	// CreateFirstExec is `podman run -d` + the first `podman exec true`.
	CreateFirstExec Summary    `json:"create_first_exec"`
	ExecTrue        Summary    `json:"exec_true"`
	Forks           []PeerFork `json:"forks"`
	// Ratios are forkbox p50 / peer p50, one per measure and runtime.
	Ratios []PeerRatio `json:"ratios"`
}

// PeerFork is a fork by hand of a source that wrote Size, as the fork
// section writes it: `podman commit` of the source, `podman run -d` of the
// committed image and the child's first `podman exec true`.
type PeerFork struct {
	Size    string  `json:"size"`
	Files   int64   `json:"files"`
	SetupMS float64 `json:"setup_ms"`
	Commit  Summary `json:"commit"`
	// ForkWall is commit + run + first exec: to the child being ready.
	ForkWall Summary `json:"fork_wall"`
}

// PeerRatio is forkbox's p50 over the peer's for one measure.
type PeerRatio struct {
	What    string  `json:"what"`
	Runtime string  `json:"runtime"`
	Forkbox float64 `json:"forkbox_ms"`
	Peer    float64 `json:"peer_ms"`
	Ratio   float64 `json:"ratio"`
}

// podman runs podman with the bench's own store.
type podman struct {
	root, runtime string
	memory        int64 // bytes: the --memory of every forkbox sandbox
	// cgroupParent holds the containers' cgroups (and conmon's), removed
	// by reset: podman's default parent stays on the host.
	cgroupParent string
}

// peerTimeout bounds each podman call (a 1 GB commit included).
const peerTimeout = 5 * time.Minute

func (p *podman) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	full := append([]string{"--root", filepath.Join(p.root, "root"), "--runroot", filepath.Join(p.root, "run"),
		"--tmpdir", filepath.Join(p.root, "tmp"), "--runtime", p.runtime, "--cgroup-manager", "cgroupfs",
		"--events-backend", "none"}, args...)
	cmd := exec.CommandContext(ctx, "podman", full...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(tail(errb.String(), 400)))
	}
	return strings.TrimSpace(out.String()), nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// peerLimits are the rlimits a peer container gets. podman's defaults
// (nofile 1048576) exceed what a process without CAP_SYS_RESOURCE may
// set on hosts like this one, and the OCI runtime then refuses to start.
var peerLimits = []string{"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"}

// start runs a container of image named name that sleeps, and returns
// once podman says it runs.
func (p *podman) start(ctx context.Context, name, image string) error {
	args := append([]string{"run", "-d", "--name", name, "--network", "none", "--memory", fmt.Sprint(p.memory), "--cgroup-parent", p.cgroupParent}, peerLimits...)
	_, err := p.run(ctx, append(args, image, "sleep", "1000000000")...)
	return err
}

func (p *podman) exec(ctx context.Context, name string, cmd ...string) (float64, error) {
	t := time.Now()
	_, err := p.run(ctx, append([]string{"exec", name}, cmd...)...)
	return ms(time.Since(t)), err
}

func (p *podman) remove(ctx context.Context, name string) {
	if _, err := p.run(context.WithoutCancel(ctx), "rm", "-f", "-t", "0", name); err != nil {
		progress("  peers: %v", err)
	}
}

// peerMissing says why the peers section cannot run here ("" if it can).
func peerMissing(runtime string) string {
	for _, bin := range []string{"podman", runtime} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("%s is not installed (apt-get install podman %s)", bin, runtime)
		}
	}
	return ""
}

// measurePeers runs the peer measures; archive is the bench image as an
// OCI archive, its name image.
func (b *bench) measurePeers(ctx context.Context, dir, archive, image string) (r PeerResult, err error) {
	o := b.opts // run checked peerMissing before any section
	mem, err := fbdaemon.ParseMemory(o.memory)
	if err != nil {
		return r, err
	}
	p := &podman{root: filepath.Join(dir, "podman"), runtime: o.peerRuntime, memory: mem,
		cgroupParent: "/forkbox-bench-peers-" + strconv.Itoa(os.Getpid())}
	for _, d := range []string{"root", "run", "tmp"} {
		if err := os.MkdirAll(filepath.Join(p.root, d), 0o700); err != nil {
			return r, err
		}
	}
	defer p.reset(ctx)
	r.OCIRuntime, r.Network = o.peerRuntime, "none"
	r.Tool = peerVersions(ctx, p)
	if _, err := p.run(ctx, "load", "-q", "-i", archive); err != nil {
		return r, err
	}
	progress("peers: podman (%s), %d run+exec, %d execs", o.peerRuntime, o.reps, o.execReps)
	var creates []float64
	for i := range o.reps + 1 { // the first is a warm-up
		name := fmt.Sprintf("peer-start-%d", i)
		t := time.Now()
		err := p.start(ctx, name, image)
		if err == nil {
			_, err = p.exec(ctx, name, "true")
		}
		d := ms(time.Since(t))
		p.remove(ctx, name)
		if err != nil {
			return r, err
		}
		if i > 0 {
			creates = append(creates, d)
		}
	}
	r.CreateFirstExec = summarize(creates)
	if err := p.start(ctx, "peer-exec", image); err != nil {
		return r, err
	}
	var execs []float64
	for i := range o.execReps + 1 {
		d, err := p.exec(ctx, "peer-exec", "true")
		if err != nil {
			p.remove(ctx, "peer-exec")
			return r, err
		}
		if i > 0 {
			execs = append(execs, d)
		}
	}
	p.remove(ctx, "peer-exec")
	r.ExecTrue = summarize(execs)
	for _, s := range o.sizes {
		if !o.sections["fork"] {
			break
		}
		size, _ := parseSize(s)
		f, err := b.peerFork(ctx, p, image, size, s)
		if err != nil {
			return r, err
		}
		r.Forks = append(r.Forks, f)
	}
	return r, nil
}

func (b *bench) peerFork(ctx context.Context, p *podman, image string, size int64, label string) (PeerFork, error) {
	f := PeerFork{Size: label, Files: max(size/fileSize, 1)}
	src := "peer-src-" + label
	t := time.Now()
	if err := p.start(ctx, src, image); err != nil {
		return f, err
	}
	defer p.remove(ctx, src)
	if _, err := p.exec(ctx, src, "sh", "-c", writeCmd(size)); err != nil {
		return f, fmt.Errorf("peer setup %s: %w", label, err)
	}
	f.SetupMS = ms(time.Since(t))
	reps := b.opts.peerForkReps
	progress("  peers %s: source ready in %.1f s; %d forks by commit + run", label, f.SetupMS/1000, reps)
	var commits, walls []float64
	for i := range reps {
		img := fmt.Sprintf("localhost/peer-fork-%s-%d", strings.ToLower(label), i)
		child := fmt.Sprintf("peer-child-%s-%d", label, i)
		t := time.Now()
		_, err := p.run(ctx, "commit", "-q", src, img)
		c := ms(time.Since(t))
		if err == nil {
			if err = p.start(ctx, child, img); err == nil {
				_, err = p.exec(ctx, child, "sh", "-c", "[ -d /data/d0 ]")
			}
		}
		w := ms(time.Since(t))
		p.remove(ctx, child)
		if _, rerr := p.run(context.WithoutCancel(ctx), "rmi", "-f", img); rerr != nil && err == nil {
			err = rerr
		}
		if err != nil {
			return f, fmt.Errorf("peer fork %s: %w", label, err)
		}
		commits, walls = append(commits, c), append(walls, w)
	}
	f.Commit, f.ForkWall = summarize(commits), summarize(walls)
	return f, nil
}

// reset removes every container and image of the bench's podman store,
// unmounts it and removes the containers' parent cgroup, so that removing
// the directory leaves nothing behind.
func (p *podman) reset(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if _, err := p.run(ctx, "rm", "-a", "-f", "-t", "0"); err != nil {
		progress("  peers: %v", err)
	}
	if _, err := p.run(ctx, "system", "reset", "-f"); err != nil {
		progress("  peers: %v", err)
	}
	name := strings.TrimPrefix(p.cgroupParent, "/")
	removeCgroupParent(filepath.Join(name, "conmon"))
	removeCgroupParent(name)
}

func peerVersions(ctx context.Context, p *podman) string {
	v := func(bin string, args ...string) string {
		out, err := exec.CommandContext(ctx, bin, args...).Output()
		if err != nil {
			return bin + " (version unknown)"
		}
		line, _, _ := strings.Cut(string(out), "\n")
		return strings.TrimSpace(line)
	}
	return v("podman", "--version") + ", " + v(p.runtime, "--version")
}

// setRatios sets r.Ratios from the forkbox figures of rep.
func (r *PeerResult) setRatios(rep *Report) {
	add := func(what, rt string, fb, peer float64) {
		if fb > 0 && peer > 0 {
			r.Ratios = append(r.Ratios, PeerRatio{What: what, Runtime: rt, Forkbox: fb, Peer: peer, Ratio: ratio(fb, peer)})
		}
	}
	for _, x := range rep.Runtimes {
		add("create + first exec", x.Runtime, x.CreateFirstExec.Median, r.CreateFirstExec.Median)
		add("exec true", x.Runtime, x.ExecTrue.Median, r.ExecTrue.Median)
	}
	for _, f := range rep.Forks {
		for _, pf := range r.Forks {
			if pf.Size == f.Size {
				add("fork to child ready, "+f.Size, f.Runtime, f.ForkWall.Median, pf.ForkWall.Median)
			}
		}
	}
}

func (r *PeerResult) print(w io.Writer) {
	fmt.Fprintf(w, "peers: %s (same image and data; no network)\n", r.Tool)
	fmt.Fprintln(w, "podman\tp50 / p95\t")
	fmt.Fprintf(w, "run + first exec\t%s\t\n", pp(r.CreateFirstExec))
	fmt.Fprintf(w, "exec true\t%s\t\n", pp(r.ExecTrue))
	for _, f := range r.Forks {
		fmt.Fprintf(w, "fork %s: commit\t%s\t\n", f.Size, pp(f.Commit))
		fmt.Fprintf(w, "fork %s: commit + run + exec\t%s\t\n", f.Size, pp(f.ForkWall))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "p50\truntime\tforkbox\tpodman\tforkbox/podman\t")
	for _, x := range r.Ratios {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.2fx\t\n", x.What, x.Runtime, num(x.Forkbox), num(x.Peer), x.Ratio)
	}
	fmt.Fprintln(w)
}
