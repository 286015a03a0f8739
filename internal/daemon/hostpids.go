package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

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
	if b, err := os.ReadFile(shmemTHPPath); err == nil {
		if w := shmemTHPWarning(string(b)); w != "" {
			log.Warn("host setting slows gVisor's memory forks and wakes", "why", w)
		}
	}
	if maxSandboxes > network.MaxBridgePorts {
		log.Warn("--max-sandboxes is more than one bridge holds", "why",
			fmt.Sprintf("a Linux bridge has at most %d ports, one per sandbox (running or hibernated); past that, creates are ResourceExhausted", network.MaxBridgePorts))
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

const shmemTHPPath = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"

// shmemTHPWarning says what a host whose shmem transparent huge pages are
// off ("never" or "deny", the kernel's default) costs gVisor ("" when they
// are on), given the content of shmemTHPPath ("always within_size advise
// [never] deny force"). The sentry backs sandbox memory with a memfd and
// asks for huge pages only where the host allows them (runsc's own host
// settings check names this one); without them a memory restore fills
// the memory file 4 KiB at a time. Measured with the bench's memory section
// at 256 MB resident (2 cores): with "advise", source downtime 200 -> 159 ms
// and a fan-out of 10 children 4.2 -> 3.1 s. The setting is the host's, so
// the daemon only says so.
func shmemTHPWarning(content string) string {
	i, j := strings.IndexByte(content, '['), strings.IndexByte(content, ']')
	if i < 0 || j < i {
		return ""
	}
	switch v := content[i+1 : j]; v {
	case "never", "deny":
		return fmt.Sprintf("%s is %q: gVisor's sandbox memory gets no huge pages, and memory checkpoints, memory forks and wakes copy it 4 KiB at a time; to allow them: echo advise > %s", shmemTHPPath, v, shmemTHPPath)
	}
	return ""
}
