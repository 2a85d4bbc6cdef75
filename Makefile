# hotproxy: `make run` builds and runs the embedded default config under
# the supervisor,
# `make test` runs the whole suite (what CI runs), `make bench` the benchmarks.

GO      ?= go
BIN     ?= bin/hotproxy
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/hotproxy/hotproxy/internal/version.Version=$(VERSION)

# Packages tested with the race detector; integration runs real processes
# and is tested without it (the binary under test is built normally).
UNIT_PKGS = $(shell $(GO) list ./... | grep -v /integration)

# Each fuzz target runs briefly in `make test`; run longer by hand with
# `make fuzz FUZZTIME=5m`.
# The budget is a count of executions, not a duration: with a duration,
# Go 1.26's fuzz coordinator can fail a target with a bare "context
# deadline exceeded" at the deadline on a loaded machine (golang/go#75804).
FUZZTIME ?= 20000x
FUZZ_TARGETS = ./config:FuzzParse ./hotrestart:FuzzDecodeMessage ./shm:FuzzReader ./shm:FuzzReaderMutateSeed ./shm:FuzzAttach ./hotrestart/supervisor:FuzzControlRequest ./http1:FuzzRequestVsNetHTTP ./http1:FuzzResponseVsNetHTTP ./http1:FuzzChunkedVsNetHTTP ./h2:FuzzRequestVsXNet

.PHONY: all build run test check unit allocs integration fuzz bench clean image

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/hotproxy

# The supervisor runs the generations: `bin/hotproxy reload` (or SIGHUP to
# the supervisor) hot-restarts them, Ctrl-C drains and stops them.
# ARGS are added to `supervise`: other ports with a copy of
# config/default.toml, e.g. make run ARGS="-c my.toml" (and --base-id N to
# run beside another instance).
ARGS ?=
run: build
	$(BIN) supervise $(ARGS)

# The container image, FROM scratch: a static binary, a passwd entry, the
# build machine's CA bundle and docker/hotproxy.toml; nothing is pulled.
# `make image IMAGE=hotproxy:v2` tags it otherwise (default
# hotproxy:$(VERSION)); docs/containers.md.
image:
	VERSION=$(VERSION) $(if $(IMAGE),IMAGE=$(IMAGE)) scripts/image.sh

test: check unit allocs integration fuzz

check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

unit:
	$(GO) test -race -count=1 -timeout 10m $(UNIT_PKGS)

# The zero-allocation assertions skip under -race (the detector allocates
# on its own account), so they run once more without it.
allocs:
	$(GO) test -count=1 -run 'Alloc' ./workers/... ./h2/ ./http1/ ./route/ ./downstream/... ./exchange/... ./upstream/... ./internal/accesslog/

integration:
	$(GO) test -count=1 -timeout 10m ./integration/...

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$name$$" -fuzztime=$(FUZZTIME) $$pkg; \
	done

bench:
	$(GO) test -run='^$$' -bench=. -benchmem -cpu 1,2 ./...
	@echo "proxy throughput and latency against a direct backend: scripts/bench.sh"

clean:
	rm -rf bin
