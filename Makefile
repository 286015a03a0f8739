# forkbox build. `make` builds bin/forkbox and bin/forkbox-agent (both static).
GO ?= go
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_CONNECT_GO_VERSION := v1.19.1
CONTROLLER_GEN_VERSION := v0.23.0
# KUBEBUILDER_ASSETS holds the etcd and kube-apiserver that the cluster
# tests run (envtest); scripts/build-control-plane.sh builds them there.
KUBEBUILDER_ASSETS ?= /var/cache/forkbox/envtest
export KUBEBUILDER_ASSETS
TOOLS := $(CURDIR)/.tools/bin

.PHONY: all build setup proto generate manifests control-plane test reliability bench demo clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/forkbox ./cmd/forkbox
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o bin/forkbox-agent ./cmd/forkbox-agent

# proto regenerates api/ from proto/ with pinned plugin versions and the
# protoc of Debian's protobuf-compiler package. proto/e2b holds E2B's envd
# services (Apache-2.0, see proto/e2b/LICENSE), served by `serve --e2b`.
proto:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)
	PATH=$(TOOLS):$$PATH protoc -I proto \
		--go_out=. --go_opt=module=github.com/forkbox/forkbox \
		--connect-go_out=. --connect-go_opt=module=github.com/forkbox/forkbox \
		proto/forkbox/v1/forkbox.proto
	PATH=$(TOOLS):$$PATH protoc -I proto/e2b \
		--go_out=. --go_opt=module=github.com/forkbox/forkbox \
		--connect-go_out=. --connect-go_opt=module=github.com/forkbox/forkbox \
		proto/e2b/process/process.proto proto/e2b/filesystem/filesystem.proto

# generate writes the deepcopy code of the cluster API types and manifests
# the CRDs and RBAC in deploy/ (controller-gen, pinned), both from the Go
# types' kubebuilder markers.
CONTROLLER_GEN = $(TOOLS)/controller-gen
$(CONTROLLER_GEN):
	GOBIN=$(TOOLS) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./internal/cluster/api/...

manifests: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) crd paths=./internal/cluster/api/... output:crd:artifacts:config=deploy/crd
	$(CONTROLLER_GEN) rbac:roleName=forkbox-controller paths=./internal/cluster/controller/... output:rbac:artifacts:config=deploy/rbac/controller
	$(CONTROLLER_GEN) rbac:roleName=forkbox-node paths=./internal/cluster/nodeagent/... output:rbac:artifacts:config=deploy/rbac/node
	$(CONTROLLER_GEN) rbac:roleName=forkbox-gateway paths=./internal/cluster/gateway/... output:rbac:artifacts:config=deploy/rbac/gateway

# control-plane builds the envtest binaries into KUBEBUILDER_ASSETS (once;
# about 6 minutes cold, instant after).
control-plane:
	./scripts/build-control-plane.sh $(KUBEBUILDER_ASSETS)

# setup installs the host prerequisites (root) and builds.
setup:
	./scripts/setup.sh

# test is the full test suite (root: real runsc, btrfs, netns, nftables):
# the Go packages and e2e (the cluster's include the TypeScript and Python
# SDKs' suites against the gateway: the TypeScript SDK is built first), then
# the TypeScript and Python SDKs against a real
# daemon (Python: Debian's python3 with python3-pytest, from setup.sh), then
# E2B's own JavaScript SDK (npm e2b, pinned) against `serve --e2b`.
# The cluster tests run a real kube-apiserver and etcd from
# KUBEBUILDER_ASSETS (control-plane builds them once).
test: setup control-plane
	$(GO) vet ./...
	cd sdk/typescript && npm ci --no-audit --no-fund && npm run build
	$(GO) test -count=1 -timeout 45m ./...
	cd sdk/typescript && npm test
	cd sdk/e2b-compat && npm ci --no-audit --no-fund && npm test
	cd sdk/python && /usr/bin/python3 -m pytest -q

# reliability is the long form of the reliability battery (root): hostile
# tenants on both runtimes, the daemon SIGKILLed at 100 seeded points of
# every operation with a leak audit after each restart, a load run (50
# sandboxes, 5,000 execs, 500 forks from 20 clients), then every Go fuzz
# target for FUZZTIME (30s) each. `make test` runs the same e2e tests in
# their bounded form. See scripts/reliability.sh and SECURITY.md.
reliability: setup
	FUZZTIME=$(or $(FUZZTIME),30s) ./scripts/reliability.sh

# bench measures start, exec, fork, fan-out and busy capture on this host with
# a throwaway daemon (root), then the same with podman in the same run
# (--peers: Debian's podman and runc, installed here if missing).
# BENCH_FLAGS=--quick for a smoke run, --json for JSON.
bench: build
	command -v podman >/dev/null && command -v runc >/dev/null || apt-get install -y -q podman runc
	$(GO) run ./tools/bench --peers $(BENCH_FLAGS)

clean:
	rm -rf bin .tools
