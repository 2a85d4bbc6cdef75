#!/usr/bin/env bash
# Measures hot-restart latency: 50 restarts (or $1) of a default-like config
# on loopback, reporting p50 and p99 of
#   exec of the child -> READY on its ready fd   (the bar: 100ms)
#   exec of the child -> the parent has drained  (from the parent's log)
#   exec of the child -> the parent has exited   (drained + commit_window 50ms)
# It is BenchmarkHotRestart in integration/hotrestart_bench_test.go; set
# HOTPROXY_BIN to measure a prebuilt binary instead of building one.
#
#   scripts/restart-bench.sh [RESTARTS]   (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."

restarts=${1:-50}
go test -count=1 -run '^$' -bench 'BenchmarkHotRestart$' -benchtime "${restarts}x" ./integration/ |
	grep -v 'no \[stats\] table'
