package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/network"
)

// Every host thread takes a PID, so the kernel's pid_max (and threads-max)
// bound how many sandboxes a host can run: an idle gVisor sandbox holds
// about 37 host threads (its sentry's, its gofer's and the systrap stubs of
// its address spaces; measured at 283 live on the pinned runsc). Past the
// bound a clone fails on the host, and gVisor reports it as an I/O error
// from a new sandbox's root file system or an exec that exits 127 (both
// seen at 864 live with pid_max 32768, the kernel's default where no
// systemd raises it to 4194304).
const pidsPerSandbox = 48

// hostPidsWarning says why pid_max or threads-max is too low for max
// sandboxes ("" when they hold them), with the command that raises them.
func hostPidsWarning(pidMax, threadsMax, maxSandboxes int) string {
	need := 4096 + maxSandboxes*pidsPerSandbox
	var low []string
	if pidMax > 0 && pidMax < need {
		low = append(low, fmt.Sprintf("kernel.pid_max is %d", pidMax))
	}
	if threadsMax > 0 && threadsMax < need {
		low = append(low, fmt.Sprintf("kernel.threads-max is %d", threadsMax))
	}
	if len(low) == 0 {
		return ""
	}
	return fmt.Sprintf("%s: %d sandboxes (--max-sandboxes) need about %d host threads; past the limit new sandboxes fail with I/O errors and execs exit 127 (raise it: sysctl -w kernel.pid_max=4194304 kernel.threads-max=%d)",
		strings.Join(low, " and "), maxSandboxes, need, max(threadsMax, 2*need))
}

// warnHostLimits logs hostPidsWarning for this host, and says so when
// --max-sandboxes is more than one bridge holds.
func warnHostLimits(log *slog.Logger, maxSandboxes int) {
	if w := hostPidsWarning(readProcInt("/proc/sys/kernel/pid_max"), readProcInt("/proc/sys/kernel/threads-max"), maxSandboxes); w != "" {
		log.Warn("host limit below what --max-sandboxes needs", "why", w)
	}
	if maxSandboxes > network.MaxBridgePorts {
		log.Warn("--max-sandboxes is more than one bridge holds", "why",
			fmt.Sprintf("a Linux bridge has at most %d ports, one per running sandbox (hibernated ones hold none); past that, creates and wakes are ResourceExhausted", network.MaxBridgePorts))
	}
}

// favorDynMods switches the host's cgroup favordynmods option on, and says
// what it did; a host where it cannot be done only gets a warning.
func favorDynMods(log *slog.Logger) {
	mp, changed, err := cgroups.FavorDynMods()
	const off = "cgroup favordynmods is off: sandbox starts wait for RCU grace periods to move processes between cgroups"
	switch {
	case errdefs.IsNotImplemented(err):
		log.Info(off+" (this kernel has no such option)", "err", err)
	case errdefs.IsNotFound(err):
		log.Warn(off+" (no cgroup2 mount to set it on: mount one, or boot with cgroup_favordynmods=true where the kernel has that parameter)", "err", err)
	case err != nil:
		log.Warn(off, "err", err)
	case changed:
		log.Info("switched cgroup favordynmods on: moving processes between cgroups (at every runsc start on cgroup v1, and crun's) no longer waits for an RCU grace period; host-wide, and its locking stays until reboot on Linux 6.18+", "mount", mp)
	default:
		log.Debug("cgroup favordynmods already on", "mount", mp)
	}
}

func readProcInt(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}
