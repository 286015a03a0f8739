#!/usr/bin/env bash
# Builds gVisor's runsc at VERSION with the patches next to this script
# applied (bounding-held.patch, checkpoint-hold.patch, cpu-limit.patch, memory-limit.patch,
# pages-parallel.patch, restore-pwrite.patch, save-holes.patch, seccheck-init.patch,
# standby.patch, start-signals.patch, state-atomic.patch, systrap-self-pid.patch)
# and its seccomp programs precompiled (precompile.go, as gVisor's Bazel
# build does), into OUT: a copy of the module's source from the Go module
# cache (downloaded through the module proxy if missing), patched, built
# static like `go install gvisor.dev/gvisor/runsc@VERSION` (the module's own
# go.mod and go.sum pin every dependency).
#
# Next to OUT, in gvisor-bin/ (where runsc looks for its sidecars), it puts
# the two sidecars gVisor's own build ships and the Go module does not:
# gvisor_sentry, the Sentry alone (sentry_main.go, built from the same
# patched source), and gvisor-sentry-prewarmer (prewarmer.c: gVisor's 1 KiB
# static program without libc, built with gcc as gVisor's Bazel rule does,
# with forkbox's trim of the bounding set), which runsc execs ahead of the
# Sentry.
#
#	scripts/gvisor/build-runsc.sh VERSION OUT
set -euo pipefail
if [ $# -ne 2 ]; then
	echo "usage: $0 VERSION OUT" >&2
	exit 2
fi
version=$1
out=$2
here="$(cd "$(dirname "$0")" && pwd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" # outside any module
src=$(go mod download -json "gvisor.dev/gvisor@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ ! -d "$src" ]; then
	echo "$0: gvisor.dev/gvisor@$version: no source in the module cache" >&2
	exit 1
fi
cp -r "$src" "$tmp/gvisor"
chmod -R u+w "$tmp/gvisor"
cd "$tmp/gvisor"
for patch in "$here"/*.patch; do
	git apply "$patch"
done
# The patches' own tests (those named Forkbox): the page reads of
# restore-pwrite.patch, the trace points' registration of
# seccheck-init.patch, the CPU limit annotation of cpu-limit.patch, the
# standby runsc of standby.patch.
GOFLAGS=-mod=mod go test -count=1 -run Forkbox ./pkg/sentry/state/stateio ./pkg/sentry/seccheck ./runsc/sandbox ./runsc/forkboxstandby
# bounding-held.patch's: the threads' bounding sets read as their union
# (without cgo, as runsc is built: AllThreadsSyscall6 needs it), and the
# prewarmer's kept set equal to what boot may ask for.
CGO_ENABLED=0 FORKBOX_PREWARMER_SOURCE="$here/prewarmer.c" GOFLAGS=-mod=mod \
	go test -count=1 -run Forkbox ./runsc/cmd/sandboxsetup ./runsc/cmd/sentry/sentrycmd
# Compiling every variant gVisor lists takes about 1.5 minutes of 2 cores;
# verify runs in a new process and compares the embedded programs with a
# fresh compile.
cp "$here/precompile.go" precompile_forkbox.go
GOFLAGS=-mod=mod go run precompile_forkbox.go generate "$tmp/gvisor"
GOFLAGS=-mod=mod go run precompile_forkbox.go verify
rm precompile_forkbox.go
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$tmp/runsc" ./runsc
cp "$here/sentry_main.go" sentry_main_forkbox.go
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$tmp/gvisor_sentry" sentry_main_forkbox.go
rm sentry_main_forkbox.go
gcc -Os -ffreestanding -fno-sanitize=all -fno-stack-protector \
	-fno-asynchronous-unwind-tables -fno-unwind-tables -static -nostdlib \
	-nostartfiles -no-pie -Wl,--build-id=none -Wl,--gc-sections -Wl,-s -Wl,-n \
	-o "$tmp/gvisor-sentry-prewarmer" "$here/prewarmer.c"
install -D -m 0755 "$tmp/runsc" "$out"
install -D -m 0755 "$tmp/gvisor_sentry" "$(dirname "$out")/gvisor-bin/gvisor_sentry"
install -D -m 0755 "$tmp/gvisor-sentry-prewarmer" "$(dirname "$out")/gvisor-bin/gvisor-sentry-prewarmer"
