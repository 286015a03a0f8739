#!/usr/bin/env bash
# The reliability battery, long form (`make reliability`), as root:
#  1. hostile tenants, hostile host events (daemon SIGKILLed at seeded
#     points of every operation, then restarted and audited for leaks) and
#     the load run, with FORKBOX_RELIABILITY=full (100 kill points; 50
#     sandboxes, 5,000 execs, 500 forks from 20 clients);
#  2. every Go fuzz target of the module, FUZZTIME each (default 30s).
# `make test` runs the same e2e tests in their bounded form.
#
# Environment: FUZZTIME=30s, FUZZMINIMIZETIME=2s, FORKBOX_CHAOS_SEED=N (replay kill points),
# FORKBOX_CHAOS_POINTS, FORKBOX_LOAD_{SANDBOXES,EXECS,FORKS,CLIENTS},
# RELIABILITY_SKIP_E2E=1 / RELIABILITY_SKIP_FUZZ=1.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}
# Each new interesting input is minimized before it joins the corpus, by
# default for up to 60 s, and the execs of a minimization are not in the
# count until it ends: FuzzUnpack spent its whole 30 s minimizing its first
# find ("81 execs", nothing added). 2 s each leaves time to fuzz: one
# worker then added 9 inputs to the corpus in 30 s.
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-2s}
log=$(mktemp -d /tmp/forkbox-reliability.XXXXXX)
failed=()

if [[ -z "${RELIABILITY_SKIP_E2E:-}" ]]; then
	echo "==> e2e battery (FORKBOX_RELIABILITY=full), log in $log/e2e.log"
	FORKBOX_RELIABILITY=full $GO test ./e2e -count=1 -v -timeout 4h \
		-run 'TestHostileTenant|TestChaosDaemonKilled|TestLoad|TestRestartWithoutRuntime|TestDaemonKilledMid|TestDaemonRestart' \
		>"$log/e2e.log" 2>&1
	rc=$?
	# The summary: every test's verdict, the seed, the load figures.
	grep -E '^(=== RUN|--- (PASS|FAIL|SKIP)|    --- (PASS|FAIL|SKIP))|chaos: |load: |escape attempt|audit: ' "$log/e2e.log" | grep -v '=== RUN' || true
	[[ $rc -eq 0 ]] || failed+=("e2e (see $log/e2e.log)")
fi

if [[ -z "${RELIABILITY_SKIP_FUZZ:-}" ]]; then
	for pkg in $($GO list ./...); do
		if ! list=$($GO test -list '^Fuzz' "$pkg" 2>&1); then
			echo "$list" | tail -n 20
			failed+=("list the fuzz targets of $pkg (it does not build)")
			continue
		fi
		targets=$(echo "$list" | grep '^Fuzz' || true)
		for target in $targets; do
			echo "==> fuzz $pkg $target for $FUZZTIME"
			out="$log/fuzz-${target}.log"
			if $GO test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" >"$out" 2>&1; then
				tail -n 3 "$out" | grep -E 'elapsed|^ok' | tail -n 2
			else
				tail -n 30 "$out"
				failed+=("fuzz $target (see $out; the failing input is under $pkg's testdata/fuzz/$target)")
			fi
		done
	done
fi

if [[ ${#failed[@]} -gt 0 ]]; then
	echo "reliability: FAILED:"
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
echo "reliability: all passed (logs in $log)"
