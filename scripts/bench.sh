#!/usr/bin/env bash
# Measures requests per second and p50/p99 latency through hotproxy against
# the same backend reached directly, with keep-alive and with a new
# connection per request. Everything runs on loopback.
#
# Pinning: the backend and hotproxy (one worker) share CPU 0, wrk runs alone
# on CPU 1, so the load generator never competes with what it measures.
#
#   scripts/bench.sh [DURATION]   (default 10s; needs 2 CPUs; installs wrk)
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${1:-10s}
connections=${CONNECTIONS:-32}
backend_port=${BACKEND_PORT:-19000}
proxy_port=${PROXY_PORT:-19080}
admin_port=${ADMIN_PORT:-19901}

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

bench_install wrk:wrk
if [ "$(nproc)" -lt 2 ]; then
	echo "bench: needs 2 CPUs to pin the load generator away from the proxy" >&2
	exit 1
fi

work=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/hotproxy" ./cmd/hotproxy
go build -o "$work/benchbackend" ./scripts/benchbackend

cat >"$work/bench.toml" <<TOML
[server]
concurrency = 1
drain_time = "2s"
parent_shutdown_time = "2s"
[admin]
address = "127.0.0.1:${admin_port}"
[log]
level = "warn"
[stats]
path = "${work}/hotproxy.stats"
[[listeners]]
name = "bench"
address = "127.0.0.1:${proxy_port}"
protocol = "http"
  [[listeners.routes]]
  prefix = "/"
  cluster = "backend"
[[clusters]]
name = "backend"
endpoints = ["127.0.0.1:${backend_port}"]
max_idle_per_endpoint = 256
TOML

taskset -c 0 "$work/benchbackend" -addr "127.0.0.1:${backend_port}" & pids+=($!)
# Its own base-id, so its restart socket (@hotproxy.<base-id>.0) is not that
# of another hotproxy on this machine, which would refuse to start it.
taskset -c 0 "$work/hotproxy" serve -c "$work/bench.toml" --base-id $((20000 + $$ % 10000)) & pids+=($!)

if ! bench_wait_http "http://127.0.0.1:${admin_port}/ready" || ! bench_wait_http "http://127.0.0.1:${backend_port}/"; then
	echo "bench: hotproxy or the backend did not become ready" >&2
	exit 1
fi

# run NAME URL [wrk args...]: prints one result line.
run() {
	local name=$1 url=$2
	shift 2
	local out
	out=$(taskset -c 1 wrk -t 1 -c "$connections" -d "$duration" --latency "$@" "$url")
	local rps p50 p99 errors
	rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
	p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
	p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
	errors=$(awk '/Socket errors|Non-2xx/ {printf "%s ", $0}' <<<"$out")
	printf '%-34s %12s req/s   p50 %-9s p99 %-9s %s\n' "$name" "$rps" "$p50" "$p99" "${errors:-no errors}"
	echo "$rps" >"$work/$name.rps"
}

echo "wrk: 1 thread, ${connections} connections, ${duration} each; backend + hotproxy on CPU 0, wrk on CPU 1"
run direct-keepalive "http://127.0.0.1:${backend_port}/"
run hotproxy-keepalive "http://127.0.0.1:${proxy_port}/"
run direct-conn-per-request "http://127.0.0.1:${backend_port}/" -H "Connection: close"
run hotproxy-conn-per-request "http://127.0.0.1:${proxy_port}/" -H "Connection: close"

for mode in keepalive conn-per-request; do
	awk -v d="$(cat "$work/direct-$mode.rps")" -v p="$(cat "$work/hotproxy-$mode.rps")" -v m="$mode" \
		'BEGIN { printf "ratio hotproxy/direct (%s): %.2f\n", m, p / d }'
done
