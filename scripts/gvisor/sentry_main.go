//go:build ignore

// sentry_main builds gVisor's gvisor_sentry sidecar: the binary that runs
// the Sentry (`runsc boot`) in place of runsc itself. gVisor's Bazel build
// ships it under gvisor-bin/ next to runsc; the Go module leaves its main
// package out (runsc/cmd/sentry/sentry_main.go upstream, whose body this
// is), and without it runsc boots with /proc/self/exe, which the
// gvisor-sentry-prewarmer sidecar (prewarmer.c) cannot name: once the
// prewarmer runs, /proc/self/exe is the prewarmer. build-runsc.sh builds
// this file inside the patched copy of gVisor's source it builds runsc
// from, so the Sentry is the same code either way.
package main

import (
	"gvisor.dev/gvisor/runsc/cli"
	"gvisor.dev/gvisor/runsc/cmd/sentry/sentrycmd"
	"gvisor.dev/gvisor/runsc/cmd/util"
	"gvisor.dev/gvisor/runsc/gvisorbinaries"
)

func main() {
	cli.Run(&gvisorbinaries.GvisorSentry, map[util.SubCommand]string{
		new(sentrycmd.Boot):   "internal use only",
		new(sentrycmd.Umount): "internal use only",
	}, nil)
}
