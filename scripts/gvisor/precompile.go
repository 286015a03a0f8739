//go:build ignore

// precompile embeds precompiled seccomp-bpf programs in runsc, as gVisor's
// Bazel build does (its precompiled_seccomp_rules rule); the Go-module
// build ships without them, and then every sandbox start (create, restore,
// wake) compiles the sentry's filter (about 600 instructions from 2,100:
// 20-30 ms of CPU measured here) and the gofer's (about 6 ms) from
// scratch. The programs are gVisor's own (PrecompiledPrograms of each
// filter config package): only the variants forkbox can run are kept
// (platforms systrap and ptrace, netstack, no GPU/TPU/RDMA proxies), with
// directfs on and off.
//
// build-runsc.sh runs it inside the copy of gVisor's source it builds,
// with the path of that source as its only argument:
//
//	go run precompile.go DIR
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	sentryfilter "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferfilter "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// anchor is the line of the stub registerPrograms after which programs
// are registered.
const anchor = "\tprograms := make(map[string]precompiledseccomp.Program)\n"

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run precompile.go GVISOR_SOURCE_DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	sentry, err := sentryfilter.PrecompiledPrograms()
	if err != nil {
		fail("sentry programs: %v", err)
	}
	gofer, err := goferfilter.PrecompiledPrograms()
	if err != nil {
		fail("gofer programs: %v", err)
	}
	n := embed(filepath.Join(dir, "runsc/boot/filter/filter_precompiled.go"), sentry, keepSentry)
	m := embed(filepath.Join(dir, "runsc/fsgofer/filter/filter_precompiled.go"), gofer, func(string) bool { return true })
	fmt.Printf("precompiled seccomp programs embedded: %d of %d sentry, %d of %d gofer\n", n, len(sentry), m, len(gofer))
}

// keepSentry keeps the sentry variants forkbox runs (its --platform may be
// systrap or ptrace; its sandboxes always use gVisor's netstack).
func keepSentry(key string) bool {
	for _, want := range []string{"HostNetwork=false", "HostNetworkRawSockets=false", "NVProxy=false", "TPUProxy=false", "RDMAProxy=false"} {
		if !strings.Contains(key, want) {
			return false
		}
	}
	return strings.Contains(key, `Platform="systrap"`) || strings.Contains(key, `Platform="ptrace"`)
}

// embed registers the programs keep accepts in the stub library at path.
func embed(path string, programs []precompiledseccomp.Program, keep func(string) bool) int {
	src, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	if bytes.Count(src, []byte(anchor)) != 1 {
		fail("%s: the stub's registerPrograms has changed; update precompile.go", path)
	}
	sort.Slice(programs, func(i, j int) bool { return programs[i].Name < programs[j].Name })
	var reg strings.Builder
	n := 0
	for _, p := range programs {
		if !keep(p.Name) {
			continue
		}
		fmt.Fprintf(&reg, "\tprograms[%q] = %s\n", p.Name, p.Expr("\t", "precompiledseccomp"))
		n++
	}
	if n == 0 {
		fail("%s: no program kept", path)
	}
	out := bytes.Replace(src, []byte(anchor), []byte(anchor+reg.String()), 1)
	out = bytes.Replace(out, []byte("const PrecompilationDisabledAtBuildTime = true"), []byte("const PrecompilationDisabledAtBuildTime = false"), 1)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		fail("%v", err)
	}
	return n
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "precompile: "+format+"\n", a...)
	os.Exit(1)
}
