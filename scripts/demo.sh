#!/usr/bin/env bash
# The main demo, from a fresh Debian 12 machine (as root): installs and
# builds forkbox, starts a throwaway daemon, prepares a sandbox once (tens of
# seconds of real work), forks N children from it, runs a task in each, and
# prints what forking saved against N fresh setups. Leaves nothing behind.
#   usage (as root): ./scripts/demo.sh [-n RUNS] [--runtime gvisor|crun]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

DEMO_FLAGS=(--state-dir /var/lib/forkbox-demo --run-dir /run/forkbox-demo --socket /run/forkbox-demo/forkbox.sock
	--bridge fbxdemo0 --net-table forkbox_demo --veth-prefix fbm --cgroup-parent forkbox-demo --subnet 10.215.0.0/24)
LOG=$(mktemp /tmp/forkbox-demo-daemon.XXXXXX.log)

cleanup() {
	[ -n "${DAEMON:-}" ] && kill -TERM "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
	./bin/forkbox uninstall --purge "${DEMO_FLAGS[@]}" --log-level warn || true
}
trap cleanup EXIT

./bin/forkbox serve "${DEMO_FLAGS[@]}" >"$LOG" 2>&1 &
DAEMON=$!
for _ in $(seq 100); do
	./bin/forkbox --host unix:///run/forkbox-demo/forkbox.sock ls >/dev/null 2>&1 && break
	kill -0 "$DAEMON" 2>/dev/null || { cat "$LOG"; exit 1; }
	sleep 0.1
done
echo "daemon up (log: $LOG)"
go run ./tools/demo --host unix:///run/forkbox-demo/forkbox.sock "$@"
