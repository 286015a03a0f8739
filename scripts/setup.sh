#!/usr/bin/env bash
# Installs what forkbox needs on a Debian 12 host (run as root) and builds it:
# Debian packages, a recent gVisor runsc (built from the Go module proxy:
# Debian's 2022 runsc cannot run sandbox networking on recent kernels), and
# bin/forkbox + bin/forkbox-agent. Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
RUNSC_BIN=/usr/local/bin/runsc
RUNSC_STAMP=/usr/local/lib/forkbox/runsc.version
# runsc is built with scripts/gvisor/memory-limit.patch (an exact memory
# limit inside gVisor: SECURITY.md, "Memory limits under gVisor"),
# checkpoint-hold.patch (a memory checkpoint that pauses, saves and holds
# the sandbox in one runsc call: internal/runtime/runsc/hold.go),
# save-holes.patch (a memory checkpoint's save skips the never-touched
# pages of sandbox memory instead of reading them),
# pages-parallel.patch (page I/O of memory checkpoints sized to the host's
# CPUs), restore-pwrite.patch (a restore writes the image's pages into the
# sandbox's memory file instead of faulting them in through its mapping),
# seccheck-init.patch (the Sentry's trace points registered without
# checking one shared field list a thousand times at every boot),
# start-signals.patch (the Sentry's signal forwarding registered beside the
# sandbox's start instead of before it), state-atomic.patch (runsc's state
# file written by rename, so a runsc killed mid-save leaves a state that
# loads), cpu-limit.patch (the Sentry shows the tenant the CPU limit an
# annotation names, not the raised quota a sandbox starts with),
# systrap-self-pid.patch and precompiled seccomp programs
# (scripts/gvisor/precompile.go), bounding-held.patch with gVisor's two
# sidecars beside it in /usr/local/bin/gvisor-bin (gvisor_sentry and
# gvisor-sentry-prewarmer, which trims the Sentry's capability bounding
# set before its exec: build-runsc.sh); FORKBOX_RUNSC_PATCHED=0 builds the
# stock one, without sidecars. The stamp holds a hash of the patches and
# the build scripts, so changing any of them rebuilds it.
RUNSC_WANT=$RUNSC_VERSION
if [ "${FORKBOX_RUNSC_PATCHED:-1}" = 1 ]; then
	RUNSC_WANT="$RUNSC_VERSION+patched-$(cat scripts/gvisor/*.patch scripts/gvisor/*.go scripts/gvisor/prewarmer.c scripts/gvisor/build-runsc.sh | sha256sum | cut -c1-12)"
fi
PACKAGES=(btrfs-progs busybox-static crun iproute2 nftables util-linux procps kmod coreutils python3-pytest chromium)

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
	echo "setup.sh: run as root (it installs packages and a runtime)" >&2
	exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	say "installing Debian packages: ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$(cat "$RUNSC_STAMP" 2>/dev/null)" != "$RUNSC_WANT" ] || [ ! -x "$RUNSC_BIN" ]; then
	say "building gVisor runsc $RUNSC_WANT (static, about 4 minutes)"
	tmp=$(mktemp -d)
	if [ "$RUNSC_WANT" != "$RUNSC_VERSION" ]; then
		scripts/gvisor/build-runsc.sh "$RUNSC_VERSION" "$tmp/runsc"
	else
		CGO_ENABLED=0 GOBIN="$tmp" go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
	fi
	# runsc runs the sidecars it finds beside it: never leave one of
	# another build there (the new ones are copied beside, then renamed).
	sidecars="$(dirname "$RUNSC_BIN")/gvisor-bin"
	rm -rf "$sidecars.new"
	if [ -d "$tmp/gvisor-bin" ]; then
		cp -r "$tmp/gvisor-bin" "$sidecars.new"
	fi
	rm -rf "$sidecars"
	install -m 0755 "$tmp/runsc" "$RUNSC_BIN"
	if [ -d "$sidecars.new" ]; then
		mv "$sidecars.new" "$sidecars"
	fi
	mkdir -p "$(dirname "$RUNSC_STAMP")"
	echo "$RUNSC_WANT" >"$RUNSC_STAMP"
	rm -rf "$tmp"
fi

say "building bin/forkbox and bin/forkbox-agent"
make -s build
say "ready: $(./bin/forkbox --help | head -1)"
