package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
)

// The spawn floor of the profile section: what starting a process costs
// inside the sandbox itself, with no agent, session or daemon around it.
// A small static Go program, copied into the sandbox, forks, execs and
// waits for `/bin/true` (busybox, what the exec figures run) and for a
// minimal static program (one exit_group, 129 bytes, written by the program
// itself; on x86-64 only), 50 times each after a warm-up, and prints the
// times. An exec of `true` through the agent cannot take less than the
// first, whatever the channel.
const spawnFloorPath = "/.forkbox-spawnfloor"

// spawnFloorSource prints {"true_ms": [...], "minimal_ms": [...]}.
const spawnFloorSource = `package main

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"runtime"
	"syscall"
	"time"
)

// minimal is an ELF64 executable whose code is exit_group(0).
func minimal() []byte {
	code := []byte{0xb8, 0xe7, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05} // mov eax,231; xor edi,edi; syscall
	const base, eh, ph = 0x400000, 64, 56
	size := uint64(eh + ph + len(code))
	le := binary.LittleEndian
	b := []byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	b = le.AppendUint16(b, 2)
	b = le.AppendUint16(b, 0x3e)
	b = le.AppendUint32(b, 1)
	b = le.AppendUint64(b, base+eh+ph)
	b = le.AppendUint64(b, eh)
	b = le.AppendUint64(b, 0)
	b = le.AppendUint32(b, 0)
	for _, v := range []uint16{eh, ph, 1, 0, 0, 0} {
		b = le.AppendUint16(b, v)
	}
	b = le.AppendUint32(b, 1)
	b = le.AppendUint32(b, 5)
	for _, v := range []uint64{0, base, base, size, size, 0x1000} {
		b = le.AppendUint64(b, v)
	}
	return append(b, code...)
}

func spawn(bin string, n int) []float64 {
	attr := &syscall.ProcAttr{Dir: "/", Env: []string{"PATH=/bin:/usr/bin"}, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Setpgid: true}}
	var out []float64
	for i := 0; i <= n; i++ {
		t := time.Now()
		pid, err := syscall.ForkExec(bin, []string{bin}, attr)
		if err != nil {
			os.Stderr.WriteString(bin + ": " + err.Error() + "\n")
			os.Exit(1)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil || ws.ExitStatus() != 0 {
			os.Stderr.WriteString(bin + ": did not exit 0\n")
			os.Exit(1)
		}
		if i > 0 { // the first is a warm-up
			out = append(out, float64(time.Since(t).Microseconds())/1000)
		}
	}
	return out
}

func main() {
	n := 50
	res := map[string][]float64{"true_ms": spawn("/bin/true", n)}
	if runtime.GOARCH == "amd64" { // minimal is x86-64 code
		const nop = "/tmp/.forkbox-spawnfloor-minimal"
		if err := os.WriteFile(nop, minimal(), 0o755); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		defer os.Remove(nop)
		res["minimal_ms"] = spawn(nop, n)
	}
	json.NewEncoder(os.Stdout).Encode(res)
}
`

// buildSpawnFloor compiles the program into dir and returns its bytes.
func buildSpawnFloor(ctx context.Context, dir string) ([]byte, error) {
	return buildStatic(ctx, dir, "spawnfloor", spawnFloorSource)
}

// measureSpawnFloor runs the program in the sandbox behind ac and returns
// the times of its two kinds of spawn.
func measureSpawnFloor(ctx context.Context, ac *agent.Client, bin []byte) (trueMS, minimalMS []float64, err error) {
	if err := ac.WriteFile(ctx, spawnFloorPath, bin, 0o755); err != nil {
		return nil, nil, fmt.Errorf("spawn floor: copy into the sandbox: %w", err)
	}
	var stdout, stderr bytes.Buffer
	res, err := ac.Exec(ctx, agent.ExecRequest{Argv: []string{spawnFloorPath}}, &stdout, &stderr)
	if err != nil {
		return nil, nil, fmt.Errorf("spawn floor: %w", err)
	}
	if res.ExitCode != 0 {
		return nil, nil, fmt.Errorf("spawn floor: exit %d: %s: %w", res.ExitCode, stderr.String(), errdefs.ErrInternal)
	}
	var out struct {
		True    []float64 `json:"true_ms"`
		Minimal []float64 `json:"minimal_ms"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, nil, fmt.Errorf("spawn floor: its output %q: %v: %w", stdout.String(), err, errdefs.ErrInternal)
	}
	return out.True, out.Minimal, nil
}
