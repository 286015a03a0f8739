package main

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/client"
)

// MemoryResult is section 6 for one resident size (gVisor): memory
// checkpoints, memory forks (one child, then a fan-out) and the filesystem
// fork of the same source beside them.
type MemoryResult struct {
	Size  string `json:"size"`
	Bytes int64  `json:"bytes"`
	// Limit is the sandboxes' memory limit (size*2 + 256Mi).
	Limit   string  `json:"limit"`
	SetupMS float64 `json:"setup_ms"`
	// ImageBytes is the first memory checkpoint's files under the
	// daemon's memimages/ (throwaway daemon only; 0 unknown).
	ImageBytes int64 `json:"image_bytes"`
	// Checkpoint is Checkpoint.CaptureMs of CheckpointMemory (runsc
	// checkpoint + snapshot); CheckpointCall the client's call; Downtime the
	// daemon's logged source_downtime_ms (checkpoint until the source is
	// restored in place; throwaway daemon only).
	Checkpoint     Summary `json:"checkpoint"`
	CheckpointCall Summary `json:"checkpoint_call"`
	Downtime       Summary `json:"source_downtime"`
	// Memory forks of one child: ForkResult.CaptureMS, ForkChild.StartMS
	// and the client's fork call until the child is ready.
	ForkCapture Summary `json:"mem_fork_capture"`
	ChildStart  Summary `json:"mem_child_start"`
	ForkWall    Summary `json:"mem_fork_wall"`
	// ForkDowntime is the source's logged downtime in a memory fork;
	// ChildRestore the child's `runsc restore` (daemon debug log only).
	ForkDowntime Summary `json:"mem_fork_source_downtime"`
	ChildRestore Summary `json:"mem_child_runsc_restore"`
	// ChildThrottled is how long each child's CPU limit held it back
	// during its start (its cgroup's throttled time; daemon debug log only).
	ChildThrottled Summary `json:"mem_child_cpu_throttled"`
	// ChildPrepare, ChildAgentReady and ChildForkNotice split each child's
	// start as the daemon logs it (debug log only): its own work before
	// runsc (snapshot, mounts, network, bundle), the restored agent's first
	// answer once runsc returned, and the fork notice (the agent's new
	// token and hostname, and the on-fork hook).
	ChildPrepare    Summary `json:"mem_child_prepare"`
	ChildAgentReady Summary `json:"mem_child_agent_ready"`
	ChildForkNotice Summary `json:"mem_child_fork_notice"`
	// Filesystem forks of one child of the same source.
	FSCapture    Summary    `json:"fs_fork_capture"`
	FSChildStart Summary    `json:"fs_child_start"`
	FSForkWall   Summary    `json:"fs_fork_wall"`
	Fanout       *MemFanout `json:"fanout,omitempty"`
	FanoutSkip   string     `json:"fanout_skipped,omitempty"`
	// Checks of "the allocator still runs and beats": sources after a
	// checkpoint, children after a memory fork. Failures are counted.
	Checks   int    `json:"alive_checks"`
	Failures int    `json:"failures"`
	FirstErr string `json:"first_error,omitempty"`
}

// MemFanout is one memory fork of many children.
type MemFanout struct {
	Count      int     `json:"count"`
	Started    int     `json:"started"`
	Alive      int     `json:"alive"`
	CaptureMS  float64 `json:"capture_ms"`
	TotalMS    float64 `json:"total_ms"`
	WallMS     float64 `json:"wall_ms"`
	ChildStart Summary `json:"child_start"`
	// Restore is each child's `runsc restore` (daemon debug log only).
	Restore Summary `json:"runsc_restore"`
	// Throttled is each child's time held back by its CPU limit during
	// its start (daemon debug log only).
	Throttled Summary `json:"cpu_throttled"`
	// Prepare, AgentReady and ForkNotice split each child's start as
	// MemoryResult's do.
	Prepare    Summary `json:"prepare"`
	AgentReady Summary `json:"agent_ready"`
	ForkNotice Summary `json:"fork_notice"`
	CloseMS    float64 `json:"close_ms"`
	// HostCPUS is the host's busy CPU time (/proc/stat, every CPU, idle
	// and iowait left out) during the fork call, in seconds: with HostCPUs
	// it bounds the call's wall time from below (HostCPUS / HostCPUs) when
	// the fan-out is CPU-bound, as on a 2-CPU host. Other work on the host
	// adds to it.
	HostCPUS float64 `json:"host_cpu_s"`
	HostCPUs int     `json:"host_cpus"`
	// HostMBPerChild is the host memory in use (MemTotal - MemAvailable)
	// after the fan-out minus before it, per started child: what one more
	// child of the image costs the host (other work on the host adds noise).
	HostMBPerChild float64 `json:"host_mb_per_child"`
	// RunningCPUms is the host CPU (ms per second) each sandbox of the
	// daemon's cgroup used over memRunningWindow once every child was up
	// and checked: the children and the source, each running the source's
	// process (a heartbeat ten times a second), divided among them (v1
	// cpuacct; 0 when unknown). What a child costs while it runs.
	RunningCPUms float64 `json:"running_cpu_ms_per_s"`
	// PageFloor is what writing every child's pages into new memory costs
	// the host with nothing else to do (see pagefloor.go), measured once
	// the children are up, when the host's memory holds as much again.
	PageFloor     *PageFloor `json:"page_floor,omitempty"`
	PageFloorSkip string     `json:"page_floor_skipped,omitempty"`
}

// memRunningWindow is the window of MemFanout.RunningCPUms.
const memRunningWindow = 2 * time.Second

// memLimit is the sandbox memory limit for a source holding size bytes.
func memLimit(size int64) string {
	return fmt.Sprintf("%dMi", (2*size+(1<<20)-1)>>20+256)
}

func (r *MemoryResult) fail(what string, err error) {
	r.Failures++
	if r.FirstErr == "" {
		r.FirstErr = fmt.Sprintf("%s: %v", what, err)
	}
	progress("  FAILED %s: %v", what, err)
}

// check records whether sb's allocator still runs.
func (r *MemoryResult) check(ctx context.Context, sb *client.Sandbox, what string) bool {
	r.Checks++
	if err := sh(ctx, sb, aliveCmd); err != nil {
		r.fail(what+": allocator not running", err)
		return false
	}
	return true
}

// memSource creates a gVisor sandbox whose allocator holds size bytes.
func (b *bench) memSource(ctx context.Context, size int64, limit string) (*client.Sandbox, error) {
	sb, err := b.c.CreateSandbox(ctx, client.CreateOptions{Image: b.image, Runtime: "gvisor",
		Resources: client.Resources{Memory: limit}})
	if err != nil {
		return nil, fmt.Errorf("create gvisor sandbox (%s): %w", limit, err)
	}
	b.track(sb)
	if err := sb.WriteFile(ctx, memhogPath, b.memhog, 0o755); err != nil {
		return sb, fmt.Errorf("write the allocator: %w", err)
	}
	if _, err := sb.Start(ctx, client.ExecOptions{Shell: fmt.Sprintf("exec %s %d >/dev/null 2>&1", memhogPath, size)}); err != nil {
		return sb, fmt.Errorf("start the allocator: %w", err)
	}
	deadline := time.Now().Add(2*time.Minute + time.Duration(size>>20)*50*time.Millisecond)
	for {
		err := sh(ctx, sb, "test -f "+memhogReady)
		if err == nil {
			return sb, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return sb, fmt.Errorf("the allocator of %d bytes did not get ready: %w", size, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *bench) measureMemory(ctx context.Context, label string, size int64) (MemoryResult, error) {
	o := b.opts
	r := MemoryResult{Size: label, Bytes: size, Limit: memLimit(size)}
	t := time.Now()
	src, err := b.memSource(ctx, size, r.Limit)
	if src != nil {
		defer b.close(ctx, src)
	}
	if err != nil {
		return r, err
	}
	r.SetupMS = ms(time.Since(t))
	if !r.check(ctx, src, "source before any checkpoint") {
		return r, fmt.Errorf("%s source: %s", label, r.FirstErr)
	}

	progress("  %s: %d memory checkpoints", label, o.memReps)
	var caps, calls, downs []float64
	for i := range o.memReps {
		t := time.Now()
		ck, err := src.CheckpointMemory(ctx, fmt.Sprintf("bench-memck-%d", i))
		call := ms(time.Since(t))
		if err != nil {
			r.fail("memory checkpoint", err)
			continue
		}
		caps, calls = append(caps, ck.CaptureMs), append(calls, call)
		if d, ok := b.loggedDowntime(ck.Id); ok {
			downs = append(downs, d)
		}
		if i == 0 {
			r.ImageBytes = b.imageBytes(ck.Id)
		}
		r.check(ctx, src, "source after a memory checkpoint")
		b.deleteCheckpoint(ctx, ck)
	}
	r.Checkpoint, r.CheckpointCall, r.Downtime = summarize(caps), summarize(calls), summarize(downs)

	progress("  %s: %d memory forks of one child", label, o.memReps)
	var fcaps, starts, walls, fdowns []float64
	var phases childPhases
	for i := range o.memReps {
		t := time.Now()
		res, err := src.Fork(ctx, client.ForkOptions{Tag: fmt.Sprintf("bench-memfork-%d", i), Count: 1, Memory: true})
		wall := ms(time.Since(t))
		if err != nil {
			r.fail("memory fork", err)
			continue
		}
		kids := res.Sandboxes()
		b.track(kids...)
		if c := res.Children[0]; c.Err != nil {
			r.fail("memory fork child", c.Err)
		} else {
			fcaps, starts, walls = append(fcaps, res.CaptureMS), append(starts, c.StartMS), append(walls, wall)
			phases.add(b, c.Sandbox.ID)
			r.check(ctx, c.Sandbox, "memory-forked child")
		}
		if res.Checkpoint != nil {
			if d, ok := b.loggedDowntime(res.Checkpoint.Id); ok {
				fdowns = append(fdowns, d)
			}
		}
		b.close(ctx, kids...)
		b.deleteCheckpoint(ctx, res.Checkpoint)
	}
	r.ForkCapture, r.ChildStart, r.ForkWall = summarize(fcaps), summarize(starts), summarize(walls)
	r.ForkDowntime = summarize(fdowns)
	r.ChildRestore, r.ChildThrottled = summarize(phases.restore), summarize(phases.throttled)
	r.ChildPrepare, r.ChildAgentReady, r.ChildForkNotice = summarize(phases.prepare), summarize(phases.ready), summarize(phases.notice)
	r.check(ctx, src, "source after the memory forks")

	b.memFanout(ctx, &r, src)

	progress("  %s: %d filesystem forks of one child", label, o.memReps)
	fcaps, starts, walls = nil, nil, nil
	for i := range o.memReps {
		c, s, w, err := b.forkOnce(ctx, src, fmt.Sprintf("bench-memfs-%d", i))
		if err != nil {
			r.fail("filesystem fork", err)
			continue
		}
		fcaps, starts, walls = append(fcaps, c), append(starts, s), append(walls, w)
	}
	r.FSCapture, r.FSChildStart, r.FSForkWall = summarize(fcaps), summarize(starts), summarize(walls)
	return r, nil
}

// memFanout forks o.memFanout children at once, when the host's available
// memory holds them all (each restores the source's resident memory).
func (b *bench) memFanout(ctx context.Context, r *MemoryResult, src *client.Sandbox) {
	n := b.opts.memFanout
	if n <= 0 {
		r.FanoutSkip = "--mem-fanout 0"
		return
	}
	// Per child: the resident size plus ~150 MB of sentry, agent and page
	// tables; 2 GiB kept for the host, the image's page cache and the rest.
	need := float64(n)*(float64(r.Bytes)+150e6)/(1<<30) + 2
	if avail := meminfo()["MemAvailable"]; avail < need {
		r.FanoutSkip = fmt.Sprintf("%d children need about %.1f GiB, %.1f GiB available", n, need, avail)
		progress("  %s: fan-out skipped: %s", r.Size, r.FanoutSkip)
		return
	}
	progress("  %s: one memory fork of %d children", r.Size, n)
	f := &MemFanout{Count: n}
	r.Fanout = f
	usedBefore := usedGiB()
	busyBefore := hostCPUBusy()
	t := time.Now()
	res, err := src.Fork(ctx, client.ForkOptions{Tag: "bench-memfanout", Count: n, Memory: true})
	f.WallMS = ms(time.Since(t))
	f.HostCPUS, f.HostCPUs = hostCPUBusy()-busyBefore, runtime.NumCPU()
	if err != nil {
		r.fail("memory fan-out", err)
		return
	}
	kids := res.Sandboxes()
	b.track(kids...)
	f.CaptureMS, f.TotalMS = res.CaptureMS, res.TotalMS
	var starts []float64
	var phases childPhases
	for _, c := range res.Children {
		if c.Err != nil {
			r.fail("memory fan-out child", c.Err)
			continue
		}
		f.Started++
		starts = append(starts, c.StartMS)
		phases.add(b, c.Sandbox.ID)
		if r.check(ctx, c.Sandbox, "fan-out child") {
			f.Alive++
		}
	}
	f.ChildStart, f.Restore, f.Throttled = summarize(starts), summarize(phases.restore), summarize(phases.throttled)
	f.Prepare, f.AgentReady, f.ForkNotice = summarize(phases.prepare), summarize(phases.ready), summarize(phases.notice)
	if f.Started > 0 {
		f.HostMBPerChild = (usedGiB() - usedBefore) * 1024 / float64(f.Started)
		if b.cgroupParent != "" {
			f.RunningCPUms = idleCPU(ctx, b.cgroupParent, memRunningWindow) / float64(f.Started+1)
		}
		b.pageFloor(f, r)
	}
	t = time.Now()
	b.close(ctx, kids...)
	f.CloseMS = ms(time.Since(t))
	b.deleteCheckpoint(ctx, res.Checkpoint)
}

// pageFloor measures f's page floor while its children are up, so that
// the floor's pages are new to the host as theirs were.
func (b *bench) pageFloor(f *MemFanout, r *MemoryResult) {
	need := float64(f.Started)*float64(r.Bytes)/(1<<30) + 2
	if avail := meminfo()["MemAvailable"]; avail < need {
		f.PageFloorSkip = fmt.Sprintf("needs about %.1f GiB beside the children, %.1f GiB available", need, avail)
		return
	}
	progress("  %s: page floor: %d x %s into new memory", r.Size, f.Started, r.Size)
	pf, err := measurePageFloor(f.Started, r.Bytes)
	if err != nil {
		f.PageFloorSkip = err.Error()
		return
	}
	f.PageFloor = &pf
}

var (
	downtimeRE = regexp.MustCompile(`msg="memory checkpoint" .*checkpoint=(\S+) .*source_downtime_ms=([0-9.]+)`)
	restoreRE  = regexp.MustCompile(`msg="container restored" .*sandbox=(\S+) .*took=(\S+)`)
	// cpu_throttled_ms is -1 where the daemon could not read it: no match.
	throttledRE = childStartedRE("cpu_throttled_ms")
	prepareRE   = childStartedRE("prepare_ms")
	readyRE     = childStartedRE("agent_ready_ms")
	noticeRE    = childStartedRE("fork_notice_ms")
)

// childStartedRE matches the daemon's "memory child started" line with its
// sandbox and the milliseconds of field as groups.
func childStartedRE(field string) *regexp.Regexp {
	return regexp.MustCompile(`msg="memory child started" sandbox=(\S+) .*` + field + `=([0-9.]+)`)
}

// childPhases gathers what the throwaway daemon's debug log says of
// memory-fork children's starts, each figure for the children that have it.
type childPhases struct {
	restore, throttled, prepare, ready, notice []float64
}

// add reads child id's figures, in one pass over the log.
func (p *childPhases) add(b *bench, id string) {
	m := b.findLogs(id, restoreRE, throttledRE, prepareRE, readyRE, noticeRE)
	if d, ok := restoreMS(m[0]); ok {
		p.restore = append(p.restore, d)
	}
	for i, out := range []*[]float64{&p.throttled, &p.prepare, &p.ready, &p.notice} {
		if d, ok := groupMS(m[i+1]); ok {
			*out = append(*out, d)
		}
	}
}

// loggedDowntime finds the source downtime the throwaway daemon logged for
// memory checkpoint id.
func (b *bench) loggedDowntime(id string) (float64, bool) { return b.loggedMS(downtimeRE, id) }

// loggedMS is the milliseconds of re's second group in the last line of
// the throwaway daemon's log that re matches with key as its first.
func (b *bench) loggedMS(re *regexp.Regexp, key string) (float64, bool) {
	return groupMS(b.findLogs(key, re)[0])
}

// groupMS is the milliseconds in a log match's second group.
func groupMS(m []string) (float64, bool) {
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[2], 64)
	return v, err == nil
}

// restoreMS is the duration in a restoreRE match, in milliseconds.
func restoreMS(m []string) (float64, bool) {
	if m == nil {
		return 0, false
	}
	d, err := time.ParseDuration(m[2])
	return ms(d), err == nil
}

// findLogs returns, for each of res, the submatches of the last line of
// the throwaway daemon's log that it matches with key as its first group
// (nil where none does), in one pass over the log.
func (b *bench) findLogs(key string, res ...*regexp.Regexp) [][]string {
	found := make([][]string, len(res))
	if b.daemonLog == "" {
		return found
	}
	f, err := os.Open(b.daemonLog)
	if err != nil {
		return found
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, key) {
			continue
		}
		for i, re := range res {
			if m := re.FindStringSubmatch(line); m != nil && m[1] == key {
				found[i] = m
			}
		}
	}
	return found
}

// imageBytes is the size of the files of memory checkpoint id on disk.
func (b *bench) imageBytes(id string) int64 {
	if b.stateDir == "" {
		return 0
	}
	var n int64
	filepath.WalkDir(filepath.Join(b.stateDir, "memimages", id), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
