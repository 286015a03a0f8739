package main

import (
	"fmt"
	"io"
)

// printMemory writes section 6.
func printMemory(w io.Writer, ms []MemoryResult) {
	fmt.Fprintf(w, "6. memory forks on gVisor: a source whose process holds N of resident memory (n=%d each; limit = 2N + 256Mi)\n", ms[0].Checkpoint.N)
	fmt.Fprintln(w, "   memory checkpoint (CheckpointMemory): the source is paused, saved (runsc checkpoint --leave-running) and snapshotted, then resumed")
	fmt.Fprintln(w, "resident\tsetup\timage MB\tcheckpoint (CaptureMs)\tsource downtime\tcall\t")
	for _, m := range ms {
		img := "-"
		if m.ImageBytes > 0 {
			img = num(float64(m.ImageBytes) / 1e6)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Size, num(m.SetupMS), img, pp(m.Checkpoint), pp(m.Downtime), pp(m.CheckpointCall))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "   one child: memory fork (children continue the allocator) vs filesystem fork of the same source")
	fmt.Fprintln(w, "   (source downtime from the daemon's log; runsc restore = the child's `runsc restore` from its debug log, within child start;")
	fmt.Fprintln(w, "   throttled = the time the child's CPU limit held it back during its start, from the same log)")
	fmt.Fprintln(w, "resident\tmem capture\tsource downtime\tmem child start\trunsc restore\tthrottled\tmem call→ready\tfs capture\tfs child start\tfs call→ready\t")
	for _, m := range ms {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Size, pp(m.ForkCapture), pp(m.ForkDowntime), pp(m.ChildStart),
			pp(m.ChildRestore), pp(m.ChildThrottled), pp(m.ForkWall), pp(m.FSCapture), pp(m.FSChildStart), pp(m.FSForkWall))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "   fan-out: one memory fork call")
	fmt.Fprintln(w, "   (host CPU: busy CPU-seconds of the whole host during the call, and that over the host's CPUs: the least wall time they allow;")
	fmt.Fprintln(w, "    running: host CPU ms per second of each child and the source afterwards, their processes running)")
	fmt.Fprintln(w, "resident\tchildren\tstarted\talive\tcapture\ttotal\tchild start\trunsc restore\tthrottled\tclose all\thost MB/child\thost CPU\trunning\t")
	for _, m := range ms {
		f := m.Fanout
		if f == nil {
			fmt.Fprintf(w, "%s\tskipped: %s\t\t\t\t\t\t\t\t\t\t\t\n", m.Size, m.FanoutSkip)
			continue
		}
		cpu := "-"
		if f.HostCPUs > 0 && f.HostCPUS > 0 {
			cpu = fmt.Sprintf("%.2f s (%.2f s on %d)", f.HostCPUS, f.HostCPUS/float64(f.HostCPUs), f.HostCPUs)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Size, f.Count, f.Started, f.Alive, num(f.CaptureMS),
			num(f.TotalMS), pp(f.ChildStart), pp(f.Restore), pp(f.Throttled), num(f.CloseMS), num(f.HostMBPerChild), cpu, num(f.RunningCPUms))
	}
	fmt.Fprintln(w)
	printPageFloors(w, ms)
	fmt.Fprintln(w, "   where a memory child's start goes (the daemon's debug log): its own work before runsc (snapshot, mounts, network, bundle),")
	fmt.Fprintln(w, "   the container's runsc restore, the restored agent's first answer, the fork notice (new token, hostname, on-fork hook)")
	fmt.Fprintln(w, "resident\tforks\tprepare\trunsc restore\tagent's first answer\tfork notice\t")
	for _, m := range ms {
		fmt.Fprintf(w, "%s\tone child\t%s\t%s\t%s\t%s\t\n", m.Size, pp(m.ChildPrepare), pp(m.ChildRestore), pp(m.ChildAgentReady), pp(m.ChildForkNotice))
		if f := m.Fanout; f != nil {
			fmt.Fprintf(w, "%s\tfan-out of %d\t%s\t%s\t%s\t%s\t\n", m.Size, f.Count, pp(f.Prepare), pp(f.Restore), pp(f.AgentReady), pp(f.ForkNotice))
		}
	}
	fmt.Fprintln(w)
	printMemTargets(w, ms)
	fmt.Fprintln(w, "   allocator still running and beating (source after each checkpoint/fork, every memory-forked child)")
	fmt.Fprintln(w, "resident\tchecks\tfailures\tfirst failure\t")
	for _, m := range ms {
		first := "-"
		if m.FirstErr != "" {
			first = m.FirstErr
			if len(first) > 200 {
				first = first[:200] + "…"
			}
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t\n", m.Size, m.Checks, m.Failures, first)
	}
	fmt.Fprintln(w)
}

// memTarget is one of issue 17's targets for this machine.
type memTarget struct {
	size, what string
	limit      float64
	got        func(m MemoryResult) (float64, bool)
	// floor, when set, is the least figure this host allows whatever
	// forkbox does (measured in the same run), or false.
	floor func(m MemoryResult) (float64, bool)
}

var memTargets = []memTarget{
	{"10MB", "memory-fork child start p50", 120, func(m MemoryResult) (float64, bool) { return m.ChildStart.Median, m.ChildStart.N > 0 }, nil},
	{"256MB", "memory-fork child start p50", 300, func(m MemoryResult) (float64, bool) { return m.ChildStart.Median, m.ChildStart.N > 0 }, nil},
	{"256MB", "fan-out of 10 children, total", 2000, func(m MemoryResult) (float64, bool) {
		return fanoutTotal(m), m.Fanout != nil && m.Fanout.Count == 10
	}, fanoutPageFloor},
	{"256MB", "source downtime of a memory fork p50", 150, func(m MemoryResult) (float64, bool) { return m.ForkDowntime.Median, m.ForkDowntime.N > 0 }, nil},
}

// met says whether v, this target's figure, is within its limit (the
// printed table and the JSON targets both ask here).
func (t memTarget) met(v float64) bool { return v <= t.limit }

func fanoutTotal(m MemoryResult) float64 {
	if m.Fanout == nil {
		return 0
	}
	return m.Fanout.TotalMS
}

// fanoutPageFloor is the fan-out's page floor: its children's pages
// written into new memory by every CPU of the host.
func fanoutPageFloor(m MemoryResult) (float64, bool) {
	if m.Fanout == nil || m.Fanout.PageFloor == nil {
		return 0, false
	}
	return m.Fanout.PageFloor.FloorMS, true
}

// hostFloor is t's floor in m, or false.
func (t memTarget) hostFloor(m MemoryResult) (float64, bool) {
	if t.floor == nil {
		return 0, false
	}
	return t.floor(m)
}

// printMemTargets says which targets this run met.
func printMemTargets(w io.Writer, ms []MemoryResult) {
	fmt.Fprintln(w, "   targets (issue 17, this machine)")
	fmt.Fprintln(w, "   (host floor: the least this host allows whatever forkbox does, measured in this run; see the page floor above)")
	fmt.Fprintln(w, "resident\ttarget\tlimit ms\tmeasured ms\tstatus\thost floor ms\t")
	for _, t := range memTargets {
		for _, m := range ms {
			if m.Size != t.size {
				continue
			}
			v, ok := t.got(m)
			status := "not measured"
			if ok && t.met(v) {
				status = "met"
			} else if ok {
				status = "missed"
			}
			floor := "-"
			if f, ok := t.hostFloor(m); ok {
				floor = num(f)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Size, t.what, num(t.limit), num(v), status, floor)
		}
	}
	fmt.Fprintln(w)
}

// printPageFloors writes each fan-out's page floor (pagefloor.go).
func printPageFloors(w io.Writer, ms []MemoryResult) {
	fmt.Fprintln(w, "   page floor: the fan-out's children's pages written into new memory (memfds, 256 KiB pwrites, one writer per CPU),")
	fmt.Fprintln(w, "   measured while the children are up; children that do not share pages cannot all start in less than the floor")
	fmt.Fprintln(w, "resident\tchildren\tMB written\twriters\twall ms\tCPU s\tfloor ms (CPU over the host's CPUs)\t")
	for _, m := range ms {
		f := m.Fanout
		switch {
		case f == nil:
		case f.PageFloor == nil:
			fmt.Fprintf(w, "%s\t%d\tskipped: %s\t\t\t\t\t\n", m.Size, f.Started, f.PageFloorSkip)
		default:
			p := f.PageFloor
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\t%.2f\t%s\t\n", m.Size, f.Started, num(float64(p.Bytes)/1e6), p.Writers, num(p.WallMS), p.CPUS, num(p.FloorMS))
		}
	}
	fmt.Fprintln(w)
}
