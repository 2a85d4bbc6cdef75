#!/usr/bin/env bash
# Interleaved A/B of two hotproxy builds, for changes of a few per cent
# that a single run of scripts/bench-peers.sh cannot see on a busy
# machine: both builds run at once, each pinned to CPU 0 with
# GOMAXPROCS=1, the benchmark backend and wrk -t1 -c64 (h2: h2load -t1
# -c16 -m10 over TLS 1.3 with ALPN h2, as bench-peers.sh's h2 mode) on CPU 1; rounds
# alternate the order, and each round's CPU per request (all threads of
# the process, from /proc/PID/task/*/schedstat) of B is divided by A's of
# the same round. Prints per mode the medians, the paired ratio's median
# and quartiles, and in how many rounds B was cheaper (docs/benchmarks.md).
#
#   scripts/bench-ab.sh BIN_A BIN_B
#   ROUNDS=30 DURATION=1s MODES="keepalive close" scripts/bench-ab.sh old/hotproxy bin/hotproxy
#
#   ROUNDS=10 DURATION=4s MODES=h2 scripts/bench-ab.sh old/hotproxy bin/hotproxy
#
#   XDS_B=1 scripts/bench-ab.sh bin/hotproxy bin/hotproxy
#
# XDS_B=1 (issue 23: the data path costs the same with xDS on) gives B
# its http listener, route and cluster (EDS) from the demo control plane
# (cmd/hotproxy-controlplane, built here) instead of its file: the same
# settings as A's, over a delta ADS stream; A and B may be one binary.
# Not with h2.
#
# Environment (defaults in brackets): ROUNDS [30], DURATION [1s],
# MODES [keepalive close; h2 also], XDS_B [0], PORT_BASE [19390, uses up
# to +14], OUT [a new /tmp/bench-ab.XXXXXX].
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

[ $# = 2 ] || { echo "usage: $0 BIN_A BIN_B" >&2; exit 2; }
for b in "$1" "$2"; do [ -x "$b" ] || { echo "bench-ab: $b is not an executable" >&2; exit 2; }; done
declare -A bin=([A]=$1 [B]=$2)
rounds=${ROUNDS:-30} d=${DURATION:-1s} modes=${MODES:-"keepalive close"} port_base=${PORT_BASE:-19390}
out=${OUT:-$(mktemp -d /tmp/bench-ab.XXXXXX)}
mkdir -p "$out"
command -v wrk >/dev/null || bench_apt_install wrk
h2_wanted=0
[[ " $modes " == *" h2 "* ]] && h2_wanted=1
if [ "$h2_wanted" = 1 ]; then
	command -v h2load >/dev/null || bench_apt_install nghttp2-client
	# A self-signed ECDSA P-256 certificate, as bench-peers.sh's h2 mode
	# (h2load does not verify it).
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
		-subj "/CN=a.example.com" -addext "subjectAltName=IP:127.0.0.1" \
		-keyout "$out/h2.key" -out "$out/h2.pem" 2>"$out/openssl.log" ||
		{ echo "bench-ab: openssl could not make the h2 certificate: $(tail -3 "$out/openssl.log")" >&2; exit 1; }
fi
go build -o "$out/" ./scripts/benchbackend
xds_b=${XDS_B:-0}
if [ "$xds_b" = 1 ]; then
	[ "$h2_wanted" = 0 ] || { echo "bench-ab: XDS_B=1 does not take the h2 mode" >&2; exit 2; }
	go build -o "$out/" ./cmd/hotproxy-controlplane
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
backend=127.0.0.1:$port_base
taskset -c 1 "$out/benchbackend" -addr "$backend" >"$out/backend.log" 2>&1 &
pids+=($!)
bench_wait_http "http://$backend/" || { echo "bench-ab: the backend did not start" >&2; exit 1; }

declare -A port pid h2port
port[A]=$((port_base + 1)) port[B]=$((port_base + 2))
h2port[A]=$((port_base + 3)) h2port[B]=$((port_base + 4))

# xds_b_bootstrap starts the demo control plane with B's listener, route
# and cluster (A's settings: idle_timeout 120s; max_idle_per_endpoint is
# 64 by default) and prints the [xds] table and its static cluster.
xds_b_bootstrap() {
	local cp=127.0.0.1:$((port_base + 5)) bport=${backend##*:}
	cat >"$out/xds-snapshot.json" <<JSON
{
  "version": "1",
  "listeners": [{
    "name": "http",
    "address": {"socket_address": {"address": "127.0.0.1", "port_value": ${port[B]}}},
    "filter_chains": [{"filters": [{
      "name": "envoy.filters.network.http_connection_manager",
      "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "http",
        "common_http_protocol_options": {"idle_timeout": "120s"},
        "rds": {"route_config_name": "http_routes", "config_source": {"ads": {}, "resource_api_version": "V3"}},
        "http_filters": [{"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
      }
    }]}]
  }],
  "routes": [{"name": "http_routes", "virtual_hosts": [{"name": "all", "domains": ["*"],
    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}]}]}],
  "clusters": [{"name": "backend", "type": "EDS",
    "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}}}],
  "endpoints": [{"cluster_name": "backend", "endpoints": [{"lb_endpoints": [
    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": $bport}}}}]}]}]
}
JSON
	taskset -c 1 "$out/hotproxy-controlplane" -file "$out/xds-snapshot.json" -listen "$cp" >"$out/controlplane.log" 2>&1 &
	pids+=($!)
	cat <<TOML
[xds]
cluster = "xds_control_plane"
node_id = "bench-ab-B"
protocol = "delta"
initial_fetch_timeout = "10s"
[[clusters]]
name = "xds_control_plane"
endpoints = ["$cp"]
http2 = true
TOML
}
for v in A B; do
	h2listener=""
	[ "$h2_wanted" = 1 ] && h2listener="[[listeners]]
name = \"h2\"
address = \"127.0.0.1:${h2port[$v]}\"
protocol = \"http\"
idle_timeout = \"120s\"
  [listeners.tls]
  certificates = [{ cert = \"$out/h2.pem\", key = \"$out/h2.key\" }]
  min_version = \"1.3\"
  alpn = [\"h2\"]
  [[listeners.routes]]
  prefix = \"/\"
  cluster = \"backend_h2\"
[[clusters]]
name = \"backend_h2\"
endpoints = [\"$backend\"]
max_idle_per_endpoint = 256"
	static="[[listeners]]
name = \"http\"
address = \"127.0.0.1:${port[$v]}\"
protocol = \"http\"
idle_timeout = \"120s\"
  [[listeners.routes]]
  prefix = \"/\"
  cluster = \"backend\"
[[clusters]]
name = \"backend\"
endpoints = [\"$backend\"]
max_idle_per_endpoint = 64"
	if [ "$v" = B ] && [ "$xds_b" = 1 ]; then
		xds_b_bootstrap >"$out/xds-bootstrap.toml"
		static=$(cat "$out/xds-bootstrap.toml")
	fi
	cat >"$out/$v.toml" <<TOML
[server]
concurrency = 1
[admin]
address = "127.0.0.1:$((port[$v] + 10))"
[log]
level = "warn"
[stats]
path = "$out/$v.stats"
$static
$h2listener
TOML
	taskset -c 0 env GOMAXPROCS=1 "${bin[$v]}" serve -c "$out/$v.toml" --base-id $((30000 + $$ % 1000 + ${#v} + port[$v] % 7)) >"$out/$v.log" 2>&1 &
	pid[$v]=$!
	pids+=("${pid[$v]}")
	bench_wait_http "http://127.0.0.1:${port[$v]}/" || { echo "bench-ab: $v (${bin[$v]}) did not answer; its log: $(tail -3 "$out/$v.log")" >&2; exit 1; }
done

# cpu_ns PID: CPU time of every thread of PID, in ns.
cpu_ns() {
	local t x s=0
	for t in /proc/"$1"/task/*/schedstat; do
		read -r x _ <"$t" && s=$((s + x))
	done
	echo "$s"
}

results=$out/results.tsv
printf 'round\tmode\tbuild\treq_per_s\tcpu_us_per_req\terrors\n' >"$results"
for r in $(seq "$rounds"); do
	for mode in $modes; do
		args=()
		[ "$mode" = close ] && args=(-H "Connection: close")
		order="A B"
		[ $((r % 2)) = 0 ] && order="B A"
		for v in $order; do
			before=$(cpu_ns "${pid[$v]}")
			if [ "$mode" = h2 ]; then
				# Printed in wrk's words, for the parser below.
				wrk_out=$(taskset -c 1 h2load -t1 -c16 -m10 -D"$d" --npn-list h2 "https://127.0.0.1:${h2port[$v]}/" |
					awk '/^finished in/ {secs = $3 + 0; rps = $4} /^requests:/ {n = $8; e = $10 + $12 + $14}
						/^status codes:/ {e += $5 + $7 + $9} END {printf "%d requests in %ss\nRequests/sec: %s\nNon-2xx %d\n", n, secs, rps, e}')
			else
				wrk_out=$(taskset -c 1 wrk -t1 -c64 -d"$d" "${args[@]}" "http://127.0.0.1:${port[$v]}/")
			fi
			after=$(cpu_ns "${pid[$v]}")
			awk -v r="$r" -v m="$mode" -v v="$v" -v c=$((after - before)) '
				/ requests in / {n = $1}
				/^Requests\/sec/ {rps = $2}
				/Socket errors/ {gsub(/,/, ""); e += $4 + $6 + $8 + $10}
				/Non-2xx/ {e += $NF}
				END {printf "%s\t%s\t%s\t%s\t%.2f\t%d\n", r, m, v, rps, c / 1000 / n, e}' <<<"$wrk_out" >>"$results"
		done
	done
done

echo "A: ${bin[A]}"
echo "B: ${bin[B]}"
echo "$rounds rounds of $d per build and mode; load average $(cut -d' ' -f1-3 /proc/loadavg)"
# stats: the median, first and third quartile of the numbers on stdin.
stats() { sort -n | awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f %.3f %.3f\n", m, v[int((NR + 3) / 4)], v[int((3 * NR + 3) / 4)]}'; }
for mode in $modes; do
	read -r med_a _ _ < <(awk -F'\t' -v m="$mode" '$2 == m && $3 == "A" {print $5}' "$results" | stats)
	read -r med_b _ _ < <(awk -F'\t' -v m="$mode" '$2 == m && $3 == "B" {print $5}' "$results" | stats)
	ratios=$(awk -F'\t' -v m="$mode" '$2 == m {c[$1 " " $3] = $5; if ($1 > n) n = $1} END {for (r = 1; r <= n; r++) print c[r " B"] / c[r " A"]}' "$results")
	read -r med_q q1 q3 < <(stats <<<"$ratios")
	cheaper=$(awk '$1 < 1 {n++} END {print n + 0}' <<<"$ratios")
	errors=$(awk -F'\t' -v m="$mode" '$2 == m {e += $6} END {print e + 0}' "$results")
	printf '%-10s CPU us/req median A %s, B %s; paired B/A median %s (quartiles %s-%s); B cheaper in %s of %s rounds; wrk errors %s\n' \
		"$mode" "$med_a" "$med_b" "$med_q" "$q1" "$q3" "$cheaper" "$rounds" "$errors"
done
echo "raw numbers: $results"
