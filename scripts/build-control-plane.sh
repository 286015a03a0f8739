#!/usr/bin/env bash
# build-control-plane.sh [OUT_DIR]
#
# Builds the two binaries controller-runtime's envtest runs (a real etcd and
# kube-apiserver) into OUT_DIR (default /var/cache/forkbox/envtest, outside
# the checkout), from the pinned modules in tools/controlplane/ and the Go
# module proxy alone. Then: export KUBEBUILDER_ASSETS=OUT_DIR.
#
# The versions are those the two go.mod files pin (etcd server, and
# k8s.io/kubernetes with its staging modules replaced by the published v0.x
# tags): the main module never requires k8s.io/kubernetes.
#
# Idempotent: a binary whose --version matches is not built again. Cold cost
# on 2 cores: about 1 min for etcd, 4-4.5 min for kube-apiserver (2.3 GB peak
# RSS), ~4 GB of module and build cache. See tools/controlplane/NOTES.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-${KUBEBUILDER_ASSETS:-/var/cache/forkbox/envtest}}

if [ -d /usr/local/go/bin ]; then PATH="/usr/local/go/bin:$PATH"; fi
GO=${GO:-go}
export CGO_ENABLED=0 GOWORK=off GOFLAGS=-buildvcs=false

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# modver DIR MODULE prints the version DIR's go.mod requires of MODULE.
modver() { (cd "$1" && "$GO" list -m -f '{{.Version}}' "$2"); }

ETCD_DIR=$ROOT/tools/controlplane/etcd
APISERVER_DIR=$ROOT/tools/controlplane/kube-apiserver
ETCD_VERSION=$(modver "$ETCD_DIR" go.etcd.io/etcd/server/v3)
K8S_VERSION=$(modver "$APISERVER_DIR" k8s.io/kubernetes)

have_etcd() {
	local v
	[ -x "$OUT/etcd" ] && v=$("$OUT/etcd" --version 2>/dev/null) &&
		grep -qx "etcd Version: ${ETCD_VERSION#v}" <<<"$v" # no pipe: no SIGPIPE under pipefail
}
have_apiserver() {
	[ -x "$OUT/kube-apiserver" ] && [ "$("$OUT/kube-apiserver" --version 2>/dev/null)" = "Kubernetes $K8S_VERSION" ]
}

if have_etcd && have_apiserver; then
	echo "control plane up to date in $OUT (etcd $ETCD_VERSION, kube-apiserver $K8S_VERSION)"
	exit 0
fi

if ! have_etcd; then
	start=$SECONDS
	(cd "$ETCD_DIR" && "$GO" build -trimpath \
		-ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" -o "$OUT/.etcd.tmp" .)
	mv -f "$OUT/.etcd.tmp" "$OUT/etcd"
	have_etcd || { echo "built etcd reports: $("$OUT/etcd" --version)" >&2; exit 1; }
	echo "etcd $ETCD_VERSION built in $((SECONDS - start))s"
fi

if ! have_apiserver; then
	start=$SECONDS
	# Version stamping as upstream's hack/lib/version.sh; the build date is
	# the module's release time, so the build is reproducible.
	info=$(cd "$APISERVER_DIR" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
		sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p')
	build_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")
	IFS=. read -r major minor _ <<<"${K8S_VERSION#v}"
	ldflags="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
		ldflags+=" -X $p.gitTreeState=archive -X $p.buildDate=${build_date:-1970-01-01T00:00:00Z}"
	done
	# Tags as upstream's hack/lib/golang.sh for non-debug builds.
	(cd "$APISERVER_DIR" && "$GO" build -trimpath -tags selinux,notest,grpcnotrace \
		-ldflags "all=$ldflags" -o "$OUT/.kube-apiserver.tmp" .)
	mv -f "$OUT/.kube-apiserver.tmp" "$OUT/kube-apiserver"
	have_apiserver || { echo "built kube-apiserver reports: $("$OUT/kube-apiserver" --version)" >&2; exit 1; }
	echo "kube-apiserver $K8S_VERSION built in $((SECONDS - start))s"
fi
echo "export KUBEBUILDER_ASSETS=$OUT"
