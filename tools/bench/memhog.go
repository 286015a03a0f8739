package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// The allocator put into memory-section sources: busybox has no program
// that holds memory, so the bench builds this one (static, CGO off).
const (
	memhogPath  = "/memhog"
	memhogReady = "/memhog.ready"
	memhogBeat  = "/memhog.hb"
)

// memhogSource allocates os.Args[1] bytes, fills them with pseudo-random
// data (gVisor leaves zero pages out of its image, so they must not be
// zero), writes the ready file, then renames a counter into the heartbeat
// file every 100 ms, forever, reading the buffer so it stays live.
const memhogSource = `package main

import (
	"encoding/binary"
	"os"
	"strconv"
	"time"
)

var buf []byte

func main() {
	n, err := strconv.ParseInt(os.Args[1], 10, 64)
	if err != nil || n < 8 {
		os.Exit(2)
	}
	buf = make([]byte, n)
	x := uint64(88172645463325252)
	for i := 0; i+8 <= len(buf); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(buf[i:], x|1)
	}
	os.WriteFile("` + memhogReady + `", []byte("ready\n"), 0o644)
	var sink byte
	for i := 1; ; i++ {
		sink ^= buf[(i*4096)%len(buf)]
		os.WriteFile("` + memhogBeat + `.tmp", []byte(strconv.Itoa(i)+"\n"), 0o644)
		os.Rename("` + memhogBeat + `.tmp", "` + memhogBeat + `")
		time.Sleep(100 * time.Millisecond)
	}
}
`

// buildMemhog compiles the allocator into dir and returns its bytes.
func buildMemhog(ctx context.Context, dir string) ([]byte, error) {
	return buildStatic(ctx, dir, "memhog", memhogSource)
}

// buildStatic compiles the one-file Go program source, module name, into a
// static Linux binary in dir and returns its bytes: the programs the
// bench copies into sandboxes.
func buildStatic(ctx context.Context, dir, name, source string) ([]byte, error) {
	src := filepath.Join(dir, name+"-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module "+name+"\n\ngo 1.21\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(source), 0o644); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build %s: %v\n%s", name, err, b)
	}
	return os.ReadFile(out)
}

// aliveCmd checks that the allocator runs and its heartbeat advances.
const aliveCmd = `a=$(cat ` + memhogBeat + `) && sleep 0.3 && b=$(cat ` + memhogBeat + `) && [ "$b" -gt "$a" ] && pidof memhog >/dev/null`
