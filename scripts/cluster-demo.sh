#!/usr/bin/env bash
# The cluster demo (as root, on a Debian 12 machine): installs and builds
# what it needs (scripts/setup.sh; the control plane, cached in
# /var/cache/forkbox/envtest, by scripts/build-control-plane.sh), starts
# kube-apiserver + etcd, `forkbox controller` and 3 `forkbox serve
# --cluster` node agents on this machine (each in its own network
# namespace, with its own btrfs, state dir and runsc root), creates a
# sandbox, writes 200 MB in it, forks 6 children, and prints where each
# landed and its fork-to-ready time. Everything it made is removed when it
# ends, also on Ctrl-C (tools/clusterdemo does it, then audits the host).
#   usage (as root): ./scripts/cluster-demo.sh [--json] [--runtime gvisor|crun] [--children N] [--write-mb MB]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >&2
./scripts/build-control-plane.sh >&2
export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-/var/cache/forkbox/envtest}
go build -o bin/clusterdemo ./tools/clusterdemo
exec ./bin/clusterdemo --bin bin/forkbox --agent bin/forkbox-agent "$@"
