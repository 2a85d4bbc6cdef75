#!/usr/bin/env bash
# A soak run of hot restart (issue 11), not part of make test: 1,000 reloads
# (or $1) at 100 ms intervals (or $2) under HTTP keep-alive,
# connection-per-request and TCP load, with three binary swaps and two
# reloads of a broken config mixed in. It prints failed requests, reload
# latency p50/p99/max, the most generations alive at once, and fds,
# goroutines and RSS of the supervisor and of the serving generation at the
# start and at the end; it fails on any failed request, on more generations
# alive than hot_restart.max_draining_generations + 2, or on a supervisor
# fd leak. It is TestSoak in integration/soak_test.go.
#
#   scripts/soak.sh [RELOADS] [INTERVAL]   (default 1000 100ms)
set -euo pipefail
cd "$(dirname "$0")/.."

export HOTPROXY_SOAK_RELOADS=${1:-1000}
export HOTPROXY_SOAK_INTERVAL=${2:-100ms}
# Local directory mode (no package argument) streams the test's output, so
# the report shows on success too.
cd integration
exec go test -count=1 -timeout 2h -run '^TestSoak$'
