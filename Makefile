# forkbox build. `make` builds bin/forkbox and bin/forkbox-agent (both static).
GO ?= go
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_CONNECT_GO_VERSION := v1.19.1
TOOLS := $(CURDIR)/.tools/bin

.PHONY: all build setup proto test reliability bench demo clean

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

# setup installs the host prerequisites (root) and builds.
setup:
	./scripts/setup.sh

# test is the full test suite (root: real runsc, btrfs, netns, nftables):
# the Go packages and e2e, then the TypeScript and Python SDKs against a real
# daemon (Python: Debian's python3 with python3-pytest, from setup.sh), then
# E2B's own JavaScript SDK (npm e2b, pinned) against `serve --e2b`.
test: setup
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 45m ./...
	cd sdk/typescript && npm ci --no-audit --no-fund && npm test
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
# a throwaway daemon (root). BENCH_FLAGS=--quick for a smoke run, --json for JSON.
bench: build
	$(GO) run ./tools/bench $(BENCH_FLAGS)

clean:
	rm -rf bin .tools
