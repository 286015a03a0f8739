//go:build ignore

// precompile embeds precompiled seccomp-bpf programs in runsc, as gVisor's
// Bazel build does (its precompiled_seccomp_rules rule); the Go-module
// build ships without them, and then every sandbox start (create, restore,
// wake) compiles the sentry's filter (about 600 instructions from 2,100:
// 20-30 ms of CPU measured here) and the gofer's (about 6 ms) from
// scratch. The programs are gVisor's own (PrecompiledPrograms of each
// filter config package). Of the sentry's, only the variants forkbox runs
// by default are kept: platform systrap, netstack, no GPU/TPU/RDMA proxies,
// directfs on and off. Any other configuration (ptrace, whose filter holds
// os.Getpid() of whoever compiles it) is compiled at start, as before.
//
// build-runsc.sh runs it twice inside the copy of gVisor's source it builds
// (with systrap-self-pid.patch applied, so that systrap's filter takes the
// sentry's PID as a variable):
//
//	go run precompile.go generate DIR  # embeds the programs
//	go run precompile.go verify        # a new process, another PID
//
// verify renders each embedded sentry program with its own values (its
// PID, a controller FD) and compares it with the program compiled from the
// rules, as runsc compiles it when nothing is embedded: a value baked in at
// build time, or any other difference, fails the build.
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/bpf"
	"gvisor.dev/gvisor/pkg/seccomp"
	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	"gvisor.dev/gvisor/pkg/sentry/platform"
	_ "gvisor.dev/gvisor/pkg/sentry/platform/platforms"
	sentryprecompiled "gvisor.dev/gvisor/runsc/boot/filter"
	sentryfilter "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferfilter "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// anchor is the line of the stub registerPrograms after which programs
// are registered.
const anchor = "\tprograms := make(map[string]precompiledseccomp.Program)\n"

func main() {
	switch {
	case len(os.Args) == 3 && os.Args[1] == "generate":
		generate(os.Args[2])
	case len(os.Args) == 2 && os.Args[1] == "verify":
		verify()
	default:
		fmt.Fprintln(os.Stderr, "usage: go run precompile.go generate GVISOR_SOURCE_DIR | verify")
		os.Exit(2)
	}
}

func generate(dir string) {
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

// verify checks every embedded sentry program against a fresh compile.
func verify() {
	c, err := platform.Lookup("systrap")
	if err != nil {
		fail("%v", err)
	}
	n := 0
	for _, info := range c.PrecompiledSeccompInfo() {
		for _, directfs := range []bool{true, false} {
			opt := sentryfilter.Options{Platform: info, HostFilesystem: directfs, ControllerFD: 17}
			key := opt.ConfigKey()
			prog, ok := sentryprecompiled.GetPrecompiled(key)
			if !ok {
				fail("verify: no embedded program for %s", key)
			}
			got, err := prog.RenderInstructions(opt.Vars())
			if err != nil {
				fail("verify: render %s: %v", key, err)
			}
			rules, deny := sentryfilter.Rules(opt)
			fresh := &seccomp.Program{
				RuleSets: []seccomp.RuleSet{{Rules: deny}, {Rules: rules, Action: seccomp.Allow}},
				Options:  sentryfilter.SeccompOptions(opt),
			}
			want, _, err := fresh.Build()
			if err != nil {
				fail("verify: compile %s: %v", key, err)
			}
			if !bytes.Equal(bpf.ToBytecode(got), bpf.ToBytecode(want)) {
				fail("verify: the embedded program for %s differs from the one compiled from its rules in process %d (%d vs %d instructions)", key, os.Getpid(), len(got), len(want))
			}
			n++
		}
	}
	fmt.Printf("precompiled seccomp programs verified: %d sentry programs equal a fresh compile in process %d\n", n, os.Getpid())
}

// keepSentry keeps the sentry variants forkbox runs by default (platform
// systrap; its sandboxes always use gVisor's netstack).
func keepSentry(key string) bool {
	for _, want := range []string{`Platform="systrap"`, "HostNetwork=false", "HostNetworkRawSockets=false", "NVProxy=false", "TPUProxy=false", "RDMAProxy=false"} {
		if !strings.Contains(key, want) {
			return false
		}
	}
	return true
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
