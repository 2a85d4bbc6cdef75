#!/usr/bin/env bash
# Measures hotproxy side by side with nginx and HAProxy, each configured as
# an equivalent reverse proxy with one worker and upstream keep-alive, so
# that the data path can be compared honestly (issue 10; docs/benchmarks.md).
#
# Per proxy and mode (keep-alive, and a new connection per request; then
# the same over TLS): req/s and p99 from wrk, and the CPU time of the
# proxy's whole process tree per request completed, and beside it the
# load side: how busy CPU 1 (the load tool and the backend) was and that
# busy time per request, the TCP segments per request, and the
# hypervisor's steal of both CPUs (a
# round the host slowed shows it). Then the resident
# memory each idle keep-alive connection costs, the memory a burst of
# simultaneous first requests leaves behind, and the CPU seconds per GiB
# through a TCP (L4) listener. Rounds are interleaved, the proxies in
# rotating order, and the medians are compared with the better of nginx and
# HAProxy; plaintext HTTP/1.1 also round by round (each round's ratio to
# the better peer of that round).
#
# TLS (issue 13): all three terminate the same ECDSA P-256 certificate
# (examples/tls/a.example.com), the same version (TLS_VERSION) and cipher
# (TLS 1.3: TLS_AES_128_GCM_SHA256, what Go picks on AES hardware, its 1.3
# suites being fixed; TLS 1.2: ECDHE-ECDSA-AES128-GCM-SHA256), ALPN
# http/1.1, and proxy to the same plaintext backend. Modes:
#   tls-keepalive  wrk over TLS: one handshake per connection, then
#                  requests (the cost of the record layer)
#   tls-close      scripts/tlsload (Go, integration/loadgen) without a
#                  session cache: a connection and a full handshake (ECDHE
#                  and an ECDSA signature) per request. Not wrk: wrk keeps
#                  each connection's session and resumes with it when it
#                  reconnects (against nginx, $ssl_session_reused said "r"
#                  for 1066 of 1070 Connection: close requests), so with
#                  wrk this mode would measure resumption, not handshakes.
#   tls-resume     tlsload with a session cache per client: a connection
#                  per request, resumed with the client's ticket (each
#                  peer's defaults: nginx ssl_session_tickets on, HAProxy
#                  tickets on, hotproxy tickets on). TLS 1.3 resumption
#                  still does ECDHE (psk_dhe_ke); it saves the certificate
#                  and its signature.
#                  Both tlsload modes report the resumed share, so a peer
#                  that did not resume, or did when it should not, shows it.
# HTTP/2 and gRPC (issue 21), each proxy on its own HTTP/2 listeners:
#   h2             h2load over TLS with ALPN h2 (-c H2_CONNS -m H2_STREAMS,
#                  one thread), TLS_VERSION as above, to the same HTTP/1.1
#                  keep-alive backend; a self-signed ECDSA P-256
#                  certificate made here with openssl (h2load does not
#                  verify). hotproxy: a TLS listener with alpn ["h2"]; nginx:
#                  listen ... ssl http2; HAProxy: bind ... ssl crt ... alpn h2
#   grpc           unary gRPC calls (grpc.health.v1.Health/Check) from
#                  scripts/grpcload (grpc-go, H2_CONNS connections x
#                  H2_STREAMS calls at once) through an h2c listener to
#                  scripts/grpcbackend (grpc-go). hotproxy: http2_cleartext
#                  to a cluster with http2 = true; nginx: listen ... http2
#                  and grpc_pass grpc://; HAProxy: bind ... proto h2 and
#                  server ... proto h2. Failed calls are reported (want 0).
#   Both run H2_DURATION per round, and a probe (curl --http2 for h2, a
#   one-second grpcload for grpc) keeps a proxy that cannot serve the
#   mode out of it, with the reason.
# A proxy whose TLS listener does not complete a verified handshake and a
# proxied request (a probe with openssl s_client and curl, before the
# runs) keeps its plaintext rows; its TLS rows say why they are missing.
# Likewise a proxy that does not start, or dies, is reported and left out,
# and the others are still measured.
#
# Pinning: each proxy on CPU 0 (GOMAXPROCS=1 for hotproxy); wrk, the
# backend and the other load tools on CPU 1. Everything on 127.0.0.1.
#
#   scripts/bench-peers.sh
#   MODES="tls-keepalive tls-close tls-resume" ROUNDS=1 DURATION=3s scripts/bench-peers.sh
#   MODES="h2 grpc" scripts/bench-peers.sh
#
# Environment (defaults in brackets):
#   MODES [keepalive close tls-keepalive tls-close tls-resume h2 grpc memory burst tcp]:
#       what to measure; the first seven are the HTTP modes above, memory
#       the idle-connection memory, burst the memory after a burst
#       (BURST_CONNS clients connect, then all send one request at the same
#       moment, none reading a response before all are sent, then stay
#       idle: the RSS of the proxy's tree 6 s later, per connection), tcp
#       the TCP bulk transfer, syscalls the system calls per request
#       (SYSCALL_REQUESTS requests with h2load, keep-alive and then a
#       connection per request, under `strace -c -f -p` attached to every
#       process of the proxy's tree: calls and errors per request by
#       system call, for all three proxies)
#   TLS_VERSION [1.3]: 1.3 or 1.2, for all three proxies (the probe lines
#       in environment.txt say what each negotiated)
#   ROUNDS [3]  DURATION [10s]  WARMUP [2s]  CONNECTIONS [64]
#   H2_DURATION [8s]: each run of h2 and grpc (DURATION is the others')
#   H2_CONNS [16]  H2_STREAMS [10]: h2load's -c and -m, grpcload's -c and -m
#   IDLE_CONNS [4000]  BURST_CONNS [4000]  TCP_BYTES [1073741824]  PORT_BASE [19100]
#   SYSCALL_REQUESTS [20000]
#   HOTPROXY [bin/hotproxy, built with `make build`]
#   OUT [a new /tmp/bench-peers.XXXXXX]: where the raw numbers and the
#       summary go; it is kept
#   KEEP [0]: 1 keeps the work directory (configs, logs) too
#
# Needs 2 CPUs; installs wrk, nginx, haproxy and h2load (nghttp2-client)
# with apt-get if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

rounds=${ROUNDS:-3}
duration=${DURATION:-10s}
warmup=${WARMUP:-2s}
connections=${CONNECTIONS:-64}
idle_conns=${IDLE_CONNS:-4000}
burst_conns=${BURST_CONNS:-4000}
tcp_bytes=${TCP_BYTES:-1073741824}
syscall_requests=${SYSCALL_REQUESTS:-20000}
port_base=${PORT_BASE:-19100}
h2_duration=${H2_DURATION:-8s}
h2_conns=${H2_CONNS:-16}
h2_streams=${H2_STREAMS:-10}
all_modes="keepalive close tls-keepalive tls-close tls-resume h2 grpc memory burst tcp syscalls"
modes=${MODES:-$all_modes}
tls_version=${TLS_VERSION:-1.3}

die() {
	echo "bench-peers: $*" >&2
	exit 1
}

for pair in "ROUNDS:$rounds" "CONNECTIONS:$connections" "H2_CONNS:$h2_conns" "H2_STREAMS:$h2_streams" "IDLE_CONNS:$idle_conns" "BURST_CONNS:$burst_conns" "TCP_BYTES:$tcp_bytes" "PORT_BASE:$port_base" "SYSCALL_REQUESTS:$syscall_requests"; do
	[[ ${pair#*:} =~ ^[1-9][0-9]*$ ]] || die "${pair%%:*}=${pair#*:}: want a positive whole number"
done
[ "$rounds" -le 100 ] || die "ROUNDS=$rounds: at most 100"
[ "$port_base" -le 65000 ] || die "PORT_BASE=$port_base: at most 65000 (the script uses PORT_BASE to PORT_BASE+34)"
http_modes=()
for mode in $modes; do
	[[ " $all_modes " == *" $mode "* ]] || die "MODES: $mode: not a mode (choose from: $all_modes)"
	[[ $mode == memory || $mode == burst || $mode == tcp || $mode == syscalls ]] || http_modes+=("$mode")
done
# wants MODE: succeeds if MODES holds MODE.
wants() { [[ " $modes " == *" $1 "* ]]; }
tls_wanted=0
[[ " ${http_modes[*]} " == *" tls-"* ]] && tls_wanted=1
h2_wanted=0
wants h2 && h2_wanted=1
grpc_wanted=0
wants grpc && grpc_wanted=1
case $tls_version in
1.3) nginx_tls="ssl_protocols TLSv1.3; ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256;"
	haproxy_tls="ssl-min-ver TLSv1.3 ssl-max-ver TLSv1.3 ciphersuites TLS_AES_128_GCM_SHA256"
	hotproxy_tls='min_version = "1.3"' ;;
1.2) nginx_tls="ssl_protocols TLSv1.2; ssl_ciphers ECDHE-ECDSA-AES128-GCM-SHA256;"
	haproxy_tls="ssl-min-ver TLSv1.2 ssl-max-ver TLSv1.2 ciphers ECDHE-ECDSA-AES128-GCM-SHA256"
	hotproxy_tls='min_version = "1.2"
  max_version = "1.2"
  cipher_suites = ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]' ;;
*) die "TLS_VERSION=$tls_version: 1.3 or 1.2" ;;
esac
for pair in "DURATION:$duration" "WARMUP:$warmup" "H2_DURATION:$h2_duration"; do
	[[ ${pair#*:} =~ ^[1-9][0-9]*[smh]$ ]] || die "${pair%%:*}=${pair#*:}: write it like wrk does, e.g. 10s or 1m"
done
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs: the proxy on CPU 0, the load on CPU 1"

# Every proxy has to hold IDLE_CONNS client connections and their
# upstream ones; raise the open-file limit, which the processes started
# below inherit.
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=65536
[ "$nofile" -gt 65536 ] && nofile=65536
ulimit -n "$nofile"
[ "$nofile" -ge $((idle_conns + 1024)) ] ||
	die "the open-file limit is $nofile, too low for IDLE_CONNS=$idle_conns (raise the hard limit, or lower IDLE_CONNS)"
[ "$nofile" -ge $((2 * burst_conns + 1024)) ] ||
	die "the open-file limit is $nofile, too low for BURST_CONNS=$burst_conns: a burst can open an upstream connection per client (raise the hard limit, or lower BURST_CONNS)"

bench_install wrk:wrk nginx:nginx haproxy:haproxy curl:curl openssl:openssl
wants syscalls && bench_install strace:strace h2load:nghttp2-client
[ "$h2_wanted" = 0 ] || bench_install h2load:nghttp2-client

clk_tck=$(getconf CLK_TCK)

proxies=(hotproxy nginx haproxy)
declare -A http_port=([hotproxy]=$((port_base + 10)) [nginx]=$((port_base + 20)) [haproxy]=$((port_base + 30)))
declare -A tcp_port=([hotproxy]=$((port_base + 11)) [nginx]=$((port_base + 21)) [haproxy]=$((port_base + 31)))
declare -A tls_port=([hotproxy]=$((port_base + 12)) [nginx]=$((port_base + 22)) [haproxy]=$((port_base + 32)))
declare -A h2_port=([hotproxy]=$((port_base + 13)) [nginx]=$((port_base + 23)) [haproxy]=$((port_base + 33)))
declare -A grpc_port=([hotproxy]=$((port_base + 14)) [nginx]=$((port_base + 24)) [haproxy]=$((port_base + 34)))
backend_port=$port_base
sink_port=$((port_base + 1))
grpc_backend_port=$((port_base + 2))
admin_port=$((port_base + 19))
for port in "$backend_port" "$sink_port" "$grpc_backend_port" "$admin_port" "${http_port[@]}" "${tcp_port[@]}" "${tls_port[@]}" "${h2_port[@]}" "${grpc_port[@]}"; do
	bench_port_free "$port" || die "127.0.0.1:$port is already in use (another benchmark running? set PORT_BASE)"
done

work=$(mktemp -d /tmp/bench-peers-work.XXXXXX)
out=${OUT:-$(mktemp -d /tmp/bench-peers.XXXXXX)}
mkdir -p "$out/wrk"
started=() # pids of every process this script started

# stop_pid PID: SIGTERM, then SIGKILL if it is still there after 5s.
stop_pid() {
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}
cleanup() {
	local pid
	for pid in "${started[@]}"; do stop_pid "$pid"; done
	if [ "${KEEP:-0}" = 1 ]; then
		echo "bench-peers: kept the work directory $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT

# --- binaries -------------------------------------------------------------

if [ -n "${HOTPROXY:-}" ]; then
	hotproxy=$HOTPROXY
	[ -x "$hotproxy" ] || die "HOTPROXY=$hotproxy is not an executable"
else
	make -s build
	hotproxy=bin/hotproxy
fi
go build -o "$work/" ./scripts/benchbackend ./scripts/idleconns ./scripts/tcpbulk ./scripts/tlsload ./scripts/grpcbackend ./scripts/grpcload

# The certificate all three serve, and the CA the TLS probe and tlsload
# verify it with. HAProxy wants the chain and the key in one file.
tls_name=a.example.com
tls_cert=$PWD/examples/tls/a.example.com.pem
tls_key=$PWD/examples/tls/a.example.com.key
tls_ca=$PWD/examples/tls/ca.pem
cat "$tls_cert" "$tls_key" >"$work/haproxy-tls.pem"

# The h2 mode's certificate: self-signed, ECDSA P-256 like the one above,
# made here (h2load does not verify it).
h2_cert=$work/h2-self-signed.pem
h2_key=$work/h2-self-signed.key
if [ "$h2_wanted" = 1 ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
		-subj "/CN=${tls_name}" -addext "subjectAltName=DNS:${tls_name},IP:127.0.0.1" \
		-keyout "$h2_key" -out "$h2_cert" 2>"$work/openssl.log" ||
		die "openssl could not make the h2 mode's self-signed certificate: $(tail -3 "$work/openssl.log")"
	cat "$h2_cert" "$h2_key" >"$work/haproxy-h2.pem"
fi

# nginx's TCP proxying is its stream module: built in, a dynamic module
# (Debian's libnginx-mod-stream, installed here if missing), or absent.
nginx_stream=none
nginx_build=$(nginx -V 2>&1)
if [[ $nginx_build == *--with-stream=dynamic* ]]; then
	stream_module=/usr/lib/nginx/modules/ngx_stream_module.so
	if [ ! -f "$stream_module" ]; then
		bench_apt_install libnginx-mod-stream ||
			echo "bench-peers: libnginx-mod-stream did not install; nginx is left out of the TCP test" >&2
	fi
	[ -f "$stream_module" ] && nginx_stream=dynamic
elif [[ $nginx_build =~ --with-stream( |$) ]]; then
	nginx_stream=static
fi

# --- configs --------------------------------------------------------------

base_id=$((20000 + $$ % 10000)) # its own restart socket, apart from other hotproxies
hotproxy_tls_listener=""
nginx_tls_server=""
haproxy_tls_frontend=""
if [ "$tls_wanted" = 1 ]; then
	hotproxy_tls_listener="[[listeners]]
name = \"https\"
address = \"127.0.0.1:${tls_port[hotproxy]}\"
protocol = \"http\"
idle_timeout = \"120s\"
  [listeners.tls]
  certificates = [{ cert = \"${tls_cert}\", key = \"${tls_key}\" }]
  ${hotproxy_tls}
  alpn = [\"http/1.1\"]
  [[listeners.routes]]
  prefix = \"/\"
  cluster = \"backend\""
	nginx_tls_server="server {
        listen 127.0.0.1:${tls_port[nginx]} ssl;
        ssl_certificate ${tls_cert};
        ssl_certificate_key ${tls_key};
        ${nginx_tls}
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto \$scheme;
            proxy_set_header X-Forwarded-Host \$host;
            proxy_set_header X-Request-Id \$request_id;
        }
    }"
	haproxy_tls_frontend="frontend https
    bind 127.0.0.1:${tls_port[haproxy]} ssl crt ${work}/haproxy-tls.pem alpn http/1.1 ${haproxy_tls}
    option forwardfor
    http-request set-header X-Forwarded-Proto https
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    unique-id-format %[uuid()]
    unique-id-header X-Request-Id
    default_backend backend"
fi
# h2 and grpc (issue 21): each proxy's HTTP/2 listeners, on upstreams of
# their own. h2's 160 concurrent streams become as many HTTP/1.1 upstream
# requests at once, so its upstream keeps up to 256 idle connections
# (hotproxy max_idle_per_endpoint, nginx keepalive; HAProxy keeps what it
# opened), apart from "backend", whose 64 the burst mode's memory figure
# depends on. nginx's grpc_pass does not multiplex either: a connection per
# call in flight, kept alive.
hotproxy_h2_listeners=""
hotproxy_h2_clusters=""
nginx_h2_servers=""
haproxy_h2_frontends=""
if [ "$h2_wanted" = 1 ]; then
	hotproxy_h2_listeners+="[[listeners]]
name = \"h2\"
address = \"127.0.0.1:${h2_port[hotproxy]}\"
protocol = \"http\"
idle_timeout = \"120s\"
  [listeners.tls]
  certificates = [{ cert = \"${h2_cert}\", key = \"${h2_key}\" }]
  ${hotproxy_tls}
  alpn = [\"h2\"]
  [[listeners.routes]]
  prefix = \"/\"
  cluster = \"backend_h2\"
"
	hotproxy_h2_clusters+="[[clusters]]
name = \"backend_h2\"
endpoints = [\"127.0.0.1:${backend_port}\"]
max_idle_per_endpoint = 256
"
	nginx_h2_servers+="upstream backend_h2 {
        server 127.0.0.1:${backend_port};
        keepalive 256;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:${h2_port[nginx]} ssl http2;
        ssl_certificate ${h2_cert};
        ssl_certificate_key ${h2_key};
        ${nginx_tls}
        location / {
            proxy_pass http://backend_h2;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto \$scheme;
            proxy_set_header X-Forwarded-Host \$host;
            proxy_set_header X-Request-Id \$request_id;
        }
    }
"
	haproxy_h2_frontends+="frontend h2
    bind 127.0.0.1:${h2_port[haproxy]} ssl crt ${work}/haproxy-h2.pem alpn h2 ${haproxy_tls}
    option forwardfor
    http-request set-header X-Forwarded-Proto https
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    unique-id-format %[uuid()]
    unique-id-header X-Request-Id
    default_backend backend
"
fi
if [ "$grpc_wanted" = 1 ]; then
	hotproxy_h2_listeners+="[[listeners]]
name = \"grpc\"
address = \"127.0.0.1:${grpc_port[hotproxy]}\"
protocol = \"http\"
http2_cleartext = true
idle_timeout = \"120s\"
  [[listeners.routes]]
  prefix = \"/\"
  cluster = \"grpc\"
"
	hotproxy_h2_clusters+="[[clusters]]
name = \"grpc\"
endpoints = [\"127.0.0.1:${grpc_backend_port}\"]
http2 = true
"
	nginx_h2_servers+="upstream grpc_backend {
        server 127.0.0.1:${grpc_backend_port};
        keepalive 256;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:${grpc_port[nginx]} http2;
        location / {
            grpc_pass grpc://grpc_backend;
            grpc_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            grpc_set_header X-Forwarded-Proto \$scheme;
            grpc_set_header X-Forwarded-Host \$host;
            grpc_set_header X-Request-Id \$request_id;
        }
    }
"
	haproxy_h2_frontends+="frontend grpc
    bind 127.0.0.1:${grpc_port[haproxy]} proto h2
    option forwardfor
    http-request set-header X-Forwarded-Proto http
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    unique-id-format %[uuid()]
    unique-id-header X-Request-Id
    default_backend grpc
backend grpc
    server grpc 127.0.0.1:${grpc_backend_port} proto h2
"
fi
cat >"$work/hotproxy.toml" <<TOML
[server]
concurrency = 1
[admin]
address = "127.0.0.1:${admin_port}"
[log]
level = "warn"
[stats]
# Stats are on, as shipped; only the region lives in the work directory.
path = "${work}/hotproxy.stats"
[[listeners]]
name = "http"
address = "127.0.0.1:${http_port[hotproxy]}"
protocol = "http"
idle_timeout = "120s"
  [[listeners.routes]]
  prefix = "/"
  cluster = "backend"
${hotproxy_tls_listener}
${hotproxy_h2_listeners}
[[listeners]]
name = "tcp"
address = "127.0.0.1:${tcp_port[hotproxy]}"
protocol = "tcp"
cluster = "sink"
[[clusters]]
name = "backend"
endpoints = ["127.0.0.1:${backend_port}"]
max_idle_per_endpoint = 64
[[clusters]]
name = "sink"
endpoints = ["127.0.0.1:${sink_port}"]
${hotproxy_h2_clusters}
TOML

# hotproxy adds X-Forwarded-For, -Proto, -Host and an X-Request-Id to every
# request and cannot be told not to; the peers are told to do the same, so
# that all three do the same work. keepalive_requests is raised because
# hotproxy does not cap requests per connection (nginx closes after 1000).
mkdir -p "$work/nginx"
nginx_load_module=""
[ "$nginx_stream" = dynamic ] && nginx_load_module="load_module ${stream_module};"
nginx_stream_block=""
if [ "$nginx_stream" != none ]; then
	nginx_stream_block="stream {
    upstream sink { server 127.0.0.1:${sink_port}; }
    server {
        listen 127.0.0.1:${tcp_port[nginx]};
        proxy_pass sink;
        proxy_timeout 120s;
    }
}"
fi
cat >"$work/nginx/nginx.conf" <<NGINX
${nginx_load_module}
daemon off;
master_process on;
user root;
worker_processes 1;
worker_rlimit_nofile ${nofile};
pid ${work}/nginx/nginx.pid;
error_log ${work}/nginx/error.log warn;
events { worker_connections $((nofile - 256)); }
http {
    access_log off;
    client_body_temp_path ${work}/nginx/body;
    proxy_temp_path ${work}/nginx/proxy;
    fastcgi_temp_path ${work}/nginx/fastcgi;
    uwsgi_temp_path ${work}/nginx/uwsgi;
    scgi_temp_path ${work}/nginx/scgi;
    keepalive_timeout 120s;
    keepalive_requests 1000000;
    upstream backend {
        server 127.0.0.1:${backend_port};
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:${http_port[nginx]};
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto \$scheme;
            proxy_set_header X-Forwarded-Host \$host;
            proxy_set_header X-Request-Id \$request_id;
        }
    }
    ${nginx_tls_server}
    ${nginx_h2_servers}
}
${nginx_stream_block}
NGINX

cat >"$work/haproxy.cfg" <<HAPROXY
global
    nbthread 1
    maxconn $(((nofile - 256) / 2))
defaults
    mode http
    maxconn $(((nofile - 256) / 2))
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 120s
    http-reuse always
frontend http
    bind 127.0.0.1:${http_port[haproxy]}
    option forwardfor
    http-request set-header X-Forwarded-Proto http
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    unique-id-format %[uuid()]
    unique-id-header X-Request-Id
    default_backend backend
${haproxy_tls_frontend}
${haproxy_h2_frontends}
backend backend
    server backend 127.0.0.1:${backend_port}
frontend tcp
    mode tcp
    bind 127.0.0.1:${tcp_port[haproxy]}
    default_backend sink
backend sink
    mode tcp
    server sink 127.0.0.1:${sink_port}
HAPROXY

# --- processes ------------------------------------------------------------

# start LOGNAME CPU COMMAND...: runs COMMAND pinned to CPU in the
# background; its pid is in $last_pid (taskset and env exec, so it is the
# command's own pid).
start() {
	local name=$1 cpu=$2
	shift 2
	taskset -c "$cpu" "$@" >"$work/$name.log" 2>&1 &
	last_pid=$!
	started+=("$last_pid")
}

# A proxy that fails is reported and left out; the others go on. Each
# reason is also in $out/failures.txt and at the end of the summary.
declare -A proxy_failed # proxy -> why it is left out of everything after
declare -A tls_failed   # proxy -> why its TLS rows are missing
declare -A tls_seen     # proxy -> the version and cipher its probe negotiated
declare -A mode_failed  # "proxy mode" (h2, grpc) -> why that mode's rows are missing
failures=$out/failures.txt
: >"$failures"

# fail_proxy NAME REASON: leaves proxy NAME out of the rest of the run.
fail_proxy() {
	proxy_failed[$1]=$2
	echo "bench-peers: $1 is left out from here on: $2" | tee -a "$failures" >&2
}

# log_tail NAME: the end of a process's log, on one line.
log_tail() { tail -5 "$work/$1.log" 2>/dev/null | tr '\n' ' '; }

declare -A proxy_pid
start_proxy() {
	case $1 in
	hotproxy) start hotproxy 0 env GOMAXPROCS=1 "$hotproxy" serve -c "$work/hotproxy.toml" --base-id "$base_id" ;;
	nginx) start nginx 0 nginx -p "$work/nginx/" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" ;;
	haproxy) start haproxy 0 haproxy -db -f "$work/haproxy.cfg" ;;
	esac
	proxy_pid[$1]=$last_pid
	if ! bench_wait_http "http://127.0.0.1:${http_port[$1]}/"; then
		fail_proxy "$1" "it did not answer on 127.0.0.1:${http_port[$1]} within 10s; its log: $(log_tail "$1")"
		return 0
	fi
	if [ "$tls_wanted" = 1 ]; then tls_probe "$1"; fi
	if [ "$h2_wanted" = 1 ]; then h2_probe "$1"; fi
	if [ "$grpc_wanted" = 1 ]; then grpc_probe "$1"; fi
}

# h2_probe NAME: one request with curl over TLS, ALPN h2 only, that must
# come back as HTTP/2 with a 200. A failure leaves NAME's h2 rows out.
h2_probe() {
	local proxy=$1 port=${h2_port[$1]} got
	unset "mode_failed[$proxy h2]"
	if ! bench_wait_tcp "$port" 100; then
		mode_failed[$proxy h2]="nothing listens on its h2 port 127.0.0.1:$port"
	else
		got=$(curl -sS --insecure --http2 --max-time 5 -o /dev/null -w '%{http_code} HTTP/%{http_version}' \
			"https://127.0.0.1:$port/" 2>&1) || true
		[ "$got" = "200 HTTP/2" ] || mode_failed[$proxy h2]="GET https://127.0.0.1:$port/ over ALPN h2 did not answer 200 over HTTP/2: $got"
	fi
	if [ -n "${mode_failed[$proxy h2]:-}" ]; then
		echo "bench-peers: $proxy: its h2 rows are left out: ${mode_failed[$proxy h2]}" | tee -a "$failures" >&2
	fi
}

# grpc_probe NAME: a second of gRPC calls, one at a time, through NAME's
# h2c listener: some must succeed and none fail. A failure leaves NAME's
# grpc rows out.
grpc_probe() {
	local proxy=$1 port=${grpc_port[$1]} got
	unset "mode_failed[$proxy grpc]"
	if ! bench_wait_tcp "$port" 100; then
		mode_failed[$proxy grpc]="nothing listens on its h2c port 127.0.0.1:$port"
	elif ! got=$(taskset -c 1 "$work/grpcload" -addr "127.0.0.1:$port" -c 1 -m 1 -d 1s 2>&1) ||
		[[ $got != *" failed=0 "* ]]; then
		mode_failed[$proxy grpc]="gRPC calls through 127.0.0.1:$port did not all succeed: $got"
	fi
	if [ -n "${mode_failed[$proxy grpc]:-}" ]; then
		echo "bench-peers: $proxy: its grpc rows are left out: ${mode_failed[$proxy grpc]}" | tee -a "$failures" >&2
	fi
}

# tls_probe NAME: a verified handshake with openssl s_client (which says
# the version and cipher negotiated), then one request through with curl.
# A failure leaves NAME's TLS rows out, with the reason.
tls_probe() {
	local proxy=$1 port=${tls_port[$1]} hs
	if ! bench_wait_tcp "$port" 100; then
		tls_failed[$proxy]="nothing listens on its TLS port 127.0.0.1:$port"
	elif ! hs=$(openssl s_client -connect "127.0.0.1:$port" -servername "$tls_name" -CAfile "$tls_ca" \
		-verify_return_error -brief </dev/null 2>&1); then
		tls_failed[$proxy]="no verified TLS handshake on 127.0.0.1:$port (openssl s_client: $(tail -2 <<<"$hs" | tr '\n' ' '))"
	else
		tls_seen[$proxy]="$(sed -n 's/^Protocol version: //p' <<<"$hs") $(sed -n 's/^Ciphersuite: //p' <<<"$hs")"
		local got
		got=$(curl -sS --max-time 5 --cacert "$tls_ca" --resolve "$tls_name:$port:127.0.0.1" -o /dev/null \
			-w '%{http_code}' "https://$tls_name:$port/" 2>&1) || true
		[ "$got" = 200 ] || tls_failed[$proxy]="TLS handshake fine, but GET https://$tls_name:$port/ did not answer 200 through it: $got"
	fi
	if [ -n "${tls_failed[$proxy]:-}" ]; then
		echo "bench-peers: $proxy: its TLS rows are left out: ${tls_failed[$proxy]}" | tee -a "$failures" >&2
	fi
}

# alive NAME: fails, and leaves NAME out with the end of its log, if proxy
# NAME has exited (or was left out before).
alive() {
	[ -z "${proxy_failed[$1]:-}" ] || return 1
	kill -0 "${proxy_pid[$1]}" 2>/dev/null && return 0
	fail_proxy "$1" "pid ${proxy_pid[$1]} has exited; its log: $(log_tail "$1")"
	return 1
}

start backend 1 "$work/benchbackend" -addr "127.0.0.1:${backend_port}"
start sink 1 "$work/tcpbulk" sink -addr "127.0.0.1:${sink_port}"
if [ "$grpc_wanted" = 1 ]; then
	start grpcbackend 1 "$work/grpcbackend" -addr "127.0.0.1:${grpc_backend_port}"
	bench_wait_tcp "$grpc_backend_port" || die "the gRPC backend did not start; its log: $(tail -5 "$work/grpcbackend.log")"
fi
bench_wait_http "http://127.0.0.1:${backend_port}/" || die "the backend did not start; its log: $(tail -5 "$work/backend.log")"
bench_wait_tcp "$sink_port" || die "the TCP sink did not start; its log: $(tail -5 "$work/sink.log")"
for proxy in "${proxies[@]}"; do start_proxy "$proxy"; done

# Check the pinning rather than trust it: every process of each proxy's
# tree on CPU 0 only, and hotproxy with one P.
pinning=""
for proxy in "${proxies[@]}"; do
	alive "$proxy" || continue
	for pid in $(bench_tree_pids "${proxy_pid[$proxy]}"); do
		cpus=$(taskset -pc "$pid" | sed 's/.*: //')
		[ "$cpus" = 0 ] || die "$proxy's pid $pid may run on CPUs $cpus, not only CPU 0"
		pinning+="$proxy $pid, "
	done
done
if alive hotproxy; then
	tr '\0' '\n' <"/proc/${proxy_pid[hotproxy]}/environ" | grep -x GOMAXPROCS=1 >/dev/null || die "hotproxy runs without GOMAXPROCS=1"
fi

# --- measurements ---------------------------------------------------------

# to_ms VALUE: wrk's latency ("812.00us", "1.23ms", "1.02s", "1.50m") in ms.
to_ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
		if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
		printf "%.3f", n
	}'
}

http_raw=$out/http.tsv
printf 'round\tproxy\tmode\treq_per_s\tp99_ms\trequests\tseconds\tcpu_ticks\tcpu_us_per_req\tcore_pct\terrors\tresumed_pct\tload_cpu_pct\tsegs_per_req\tsteal_pct\tload_us_per_req\n' >"$http_raw"

# skip_reason PROXY MODE: why PROXY cannot run MODE ("" if it can). Call
# alive first, outside $(...): what alive learns must outlive a subshell.
skip_reason() {
	if [ -n "${proxy_failed[$1]:-}" ]; then
		echo "${proxy_failed[$1]}"
	elif [[ $2 == tls-* ]] && [ -n "${tls_failed[$1]:-}" ]; then
		echo "${tls_failed[$1]}"
	elif [ -n "${mode_failed[$1 $2]:-}" ]; then
		echo "${mode_failed[$1 $2]}"
	fi
}

# wrk_run PROXY MODE DURATION: runs the load of MODE against PROXY (wrk;
# tlsload for tls-close and tls-resume); the output is in $wrk_out and the proxy tree's
# CPU ticks during the run in $wrk_ticks. The load side's figures go to
# $wrk_load_ticks ("busy total" ticks of CPU 1, where the load tool and
# the backend run) and $wrk_segments (TCP segments the machine sent):
# they say whether req/s was the proxy's or the load side's; the
# hypervisor's steal of both CPUs to $wrk_steal ("steal total" ticks),
# which says whether the machine slowed the run. Fails, with
# the reason in $wrk_out, if the load tool failed or the proxy died.
wrk_run() {
	local proxy=$1 mode=$2 d=$3 before after args=() url="http://127.0.0.1:${http_port[$1]}/" resume
	local load_before load_after segs_before steal_before steal_after
	[ "$mode" = close ] && args=(-H "Connection: close")
	[[ $mode == tls-* ]] && url="https://127.0.0.1:${tls_port[$proxy]}/"
	[ "$mode" = h2 ] && url="https://127.0.0.1:${h2_port[$proxy]}/"
	alive "$proxy" || { wrk_out="${proxy_failed[$proxy]}"; return 1; }
	before=$(bench_tree_ticks "${proxy_pid[$proxy]}")
	load_before=$(bench_cpu_ticks 1)
	steal_before=$(bench_cpu_steal)
	segs_before=$(bench_tcp_segments)
	if [ "$mode" = h2 ]; then
		wrk_out=$(taskset -c 1 h2load -t 1 -c "$h2_conns" -m "$h2_streams" -D "$d" --npn-list h2 "$url" 2>&1) ||
			{ wrk_out="h2load failed against $proxy ($mode): $wrk_out"; return 1; }
	elif [ "$mode" = grpc ]; then
		wrk_out=$(taskset -c 1 "$work/grpcload" -addr "127.0.0.1:${grpc_port[$proxy]}" -c "$h2_conns" -m "$h2_streams" -d "$d" 2>&1) ||
			{ wrk_out="grpcload failed against $proxy ($mode): $wrk_out"; return 1; }
	elif [ "$mode" = tls-close ] || [ "$mode" = tls-resume ]; then
		resume=false
		[ "$mode" = tls-resume ] && resume=true
		wrk_out=$(taskset -c 1 "$work/tlsload" -url "$url" -ca "$tls_ca" -server-name "$tls_name" \
			-c "$connections" -d "$d" -tls "$tls_version" -resume="$resume" 2>&1) ||
			{ wrk_out="tlsload failed against $proxy ($mode): $wrk_out"; return 1; }
	else
		wrk_out=$(taskset -c 1 wrk -t 1 -c "$connections" -d "$d" --latency "${args[@]}" "$url" 2>&1) ||
			{ wrk_out="wrk failed against $proxy ($mode): $wrk_out"; return 1; }
	fi
	after=$(bench_tree_ticks "${proxy_pid[$proxy]}")
	wrk_segments=$(($(bench_tcp_segments) - segs_before))
	load_after=$(bench_cpu_ticks 1)
	steal_after=$(bench_cpu_steal)
	wrk_ticks=$((after - before))
	wrk_steal="$((${steal_after% *} - ${steal_before% *})) $((${steal_after#* } - ${steal_before#* }))"
	wrk_load_ticks="$((${load_after% *} - ${load_before% *})) $((${load_after#* } - ${load_before#* }))"
	alive "$proxy" || { wrk_out="${proxy_failed[$proxy]}"; return 1; }
}

# http_run ROUND PROXY MODE: one measured run, appended to $http_raw; a
# proxy that cannot run MODE, or whose run failed, gets a row of "-" and
# the reason.
http_run() {
	local round=$1 proxy=$2 mode=$3 rps p99 requests seconds errors cpu core resumed="-" why d=$duration
	[[ $mode == h2 || $mode == grpc ]] && d=$h2_duration
	alive "$proxy" || true
	why=$(skip_reason "$proxy" "$mode")
	if [ -z "$why" ] && ! wrk_run "$proxy" "$mode" "$d"; then
		why=$wrk_out
		echo "bench-peers: round $round, $proxy $mode: $why" >>"$failures"
	fi
	if [ -n "$why" ]; then
		printf '%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\tfailed\t-\t-\t-\t-\t-\n' "$round" "$proxy" "$mode" >>"$http_raw"
		printf '  round %s  %-9s %-13s no figures: %s\n' "$round" "$proxy" "$mode" "$why"
		return 0
	fi
	echo "$wrk_out" >"$out/wrk/$round-$proxy-$mode.txt"
	if [ "$mode" = h2 ]; then
		# h2load: "finished in 8.00s, 41234.50 req/s, ...", "requests: N
		# total, N started, D done, S succeeded, F failed, E errored, T
		# timeout", "status codes: X 2xx, Y 3xx, Z 4xx, W 5xx". It has no
		# percentiles. Its status codes also count the answers that came
		# after -D ended (so 2xx can exceed done): errors are the failed,
		# errored and timed-out requests and every answer not 2xx.
		rps=$(sed -n 's/^finished in [0-9.]*s, \([0-9.]*\) req\/s.*/\1/p' <<<"$wrk_out")
		seconds=$(sed -n 's/^finished in \([0-9.]*\)s,.*/\1/p' <<<"$wrk_out")
		requests=$(sed -n 's/^requests: .* \([0-9]*\) done,.*/\1/p' <<<"$wrk_out")
		errors=$(awk '/^requests: / {for (i = 2; i <= NF; i++) if ($i ~ /^(failed|errored|timeout)/) n += $(i - 1)}
			/^status codes: / {for (i = 2; i <= NF; i++) if ($i ~ /^[345]xx/) n += $(i - 1)}
			END {print n + 0}' <<<"$wrk_out")
		p99=-
	elif [ "$mode" = grpc ]; then
		# grpcload: calls= ok= failed= seconds= calls_per_s= mean_ms= p99_ms=
		kv() { sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" <<<"$wrk_out" | head -1; }
		requests=$(kv calls)
		seconds=$(kv seconds)
		errors=$(kv failed)
		rps=$(kv calls_per_s)
		p99=$(kv p99_ms)
	elif [ "$mode" = tls-close ] || [ "$mode" = tls-resume ]; then
		# tlsload: requests= seconds= errors= full= resumed=
		kv() { sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" <<<"$wrk_out" | head -1; }
		requests=$(kv requests)
		seconds=$(kv seconds)
		errors=$(kv errors)
		rps=$(awk -v n="$requests" -v s="$seconds" 'BEGIN {printf "%.2f", n / s}')
		p99=-
		resumed=$(awk -v f="$(kv full)" -v r="$(kv resumed)" 'BEGIN {if (f + r) printf "%.1f", 100 * r / (f + r); else print "-"}')
	else
		rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$wrk_out")
		p99=$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$wrk_out")")
		requests=$(awk '/ requests in / {print $1}' <<<"$wrk_out")
		seconds=$(awk '/ requests in / {s = $4; sub(/s,?$/, "", s); print s}' <<<"$wrk_out")
		# Socket errors and non-2xx answers: a run with any is flagged.
		errors=$(awk '/Socket errors/ {gsub(/,/, ""); n += $4 + $6 + $8 + $10} /Non-2xx/ {n += $NF} END {print n + 0}' <<<"$wrk_out")
	fi
	if [ "${requests:-0}" -gt 0 ]; then
		cpu=$(awk -v t="$wrk_ticks" -v hz="$clk_tck" -v n="$requests" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
	else
		cpu=-
	fi
	core=$(awk -v t="$wrk_ticks" -v hz="$clk_tck" -v s="$seconds" 'BEGIN {printf "%.0f", t / hz / s * 100}')
	# The load side: how busy CPU 1 was (at 100 % the load tool and the
	# backend set req/s, whatever the proxy), and the TCP segments per
	# request (both hops, both directions, the machine's whole count).
	load=$(awk -v b="${wrk_load_ticks% *}" -v t="${wrk_load_ticks#* }" 'BEGIN {if (t > 0) printf "%.0f", 100 * b / t; else print "-"}')
	# And what that busy time is per request: with CPU 1 at ~100 %, req/s
	# is one over it, so a proxy whose answers cost the load tool and the
	# backend more (say, by waking them more often) gets fewer req/s for
	# the same CPU of its own.
	load_us=$(awk -v b="${wrk_load_ticks% *}" -v hz="$clk_tck" -v n="${requests:-0}" 'BEGIN {if (n > 0) printf "%.2f", b / hz * 1e6 / n; else print "-"}')
	segs=$(awk -v s="$wrk_segments" -v n="${requests:-0}" 'BEGIN {if (n > 0) printf "%.2f", s / n; else print "-"}')
	# The hypervisor's steal of both CPUs: a round with some ran slower
	# for a reason outside the machine.
	steal=$(awk -v s="${wrk_steal% *}" -v t="${wrk_steal#* }" 'BEGIN {if (t > 0) printf "%.1f", 100 * s / t; else print "-"}')
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$proxy" "$mode" "$rps" "$p99" "$requests" "$seconds" "$wrk_ticks" "$cpu" "$core" "$errors" "$resumed" "$load" "$segs" "$steal" "$load_us" >>"$http_raw"
	printf '  round %s  %-9s %-13s %10s req/s  p99 %8s ms  %7s CPU us/req  core %3s%%  load %3s%% %6s us/req  %5s segs/req  steal %4s%%  errors %s%s\n' \
		"$round" "$proxy" "$mode" "$rps" "$p99" "$cpu" "$core" "$load" "$load_us" "$segs" "$steal" "$errors" "$([ "$resumed" = - ] || echo "  resumed ${resumed}%")"
}

tcp_raw=$out/tcp.tsv
printf 'round\tproxy\tbytes\tseconds\tmib_per_s\tcpu_ticks\tcpu_s_per_gib\n' >"$tcp_raw"

# tcp_run ROUND PROXY: TCP_BYTES through PROXY's TCP listener to the sink.
tcp_run() {
	local round=$1 proxy=$2 before after result ticks secs rate per_gib
	alive "$proxy" || return 0
	before=$(bench_tree_ticks "${proxy_pid[$proxy]}")
	if ! result=$(taskset -c 1 "$work/tcpbulk" send -addr "127.0.0.1:${tcp_port[$proxy]}" -bytes "$tcp_bytes" 2>&1); then
		echo "bench-peers: round $round, $proxy tcp: the transfer failed: $result" | tee -a "$failures" >&2
		return 0
	fi
	after=$(bench_tree_ticks "${proxy_pid[$proxy]}")
	alive "$proxy" || return 0
	ticks=$((after - before))
	secs=$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' <<<"$result")
	rate=$(sed -n 's/.*mib_per_s=\([0-9.]*\).*/\1/p' <<<"$result")
	per_gib=$(awk -v t="$ticks" -v hz="$clk_tck" -v b="$tcp_bytes" 'BEGIN {printf "%.3f", t / hz / (b / 1073741824)}')
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$proxy" "$tcp_bytes" "$secs" "$rate" "$ticks" "$per_gib" >>"$tcp_raw"
	printf '  round %s  %-9s tcp       %8s MiB/s  %7s CPU s/GiB\n' "$round" "$proxy" "$rate" "$per_gib"
}

tcp_proxies=(hotproxy haproxy)
[ "$nginx_stream" != none ] && tcp_proxies=(hotproxy nginx haproxy)

{
	echo "bench-peers: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -r), $(nproc) CPUs"
	echo "hotproxy: $("$hotproxy" version 2>&1 | head -1) ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
	echo "nginx: $(nginx -v 2>&1 | sed 's/^nginx version: //'); haproxy: $(haproxy -v 2>&1 | head -1)"
	echo "modes: ${modes}"
	echo "wrk: -t1 -c${connections} -d${duration} --latency; rounds: ${rounds}; idle connections: ${idle_conns}; burst: ${burst_conns}; TCP: ${tcp_bytes} bytes"
	if [ "$tls_wanted" = 1 ]; then
		echo "TLS: ${tls_name} (ECDSA P-256, examples/tls), TLS_VERSION ${tls_version}, ALPN http/1.1; tls-close and tls-resume: scripts/tlsload -c${connections} -d${duration}, X25519"
		for proxy in "${proxies[@]}"; do
			echo "TLS probe: ${proxy}: ${tls_seen[$proxy]:-no handshake}${tls_failed[$proxy]:+ (left out: ${tls_failed[$proxy]})}"
		done
	fi
	if [ "$h2_wanted" = 1 ]; then
		echo "h2: h2load -t1 -c${h2_conns} -m${h2_streams} -D${h2_duration} --npn-list h2 ($(h2load --version 2>&1 | head -1)), TLS_VERSION ${tls_version}, a self-signed ECDSA P-256 certificate, HTTP/1.1 keep-alive backend"
	fi
	if [ "$grpc_wanted" = 1 ]; then
		echo "grpc: scripts/grpcload -c${h2_conns} -m${h2_streams} -d${h2_duration} (grpc-go $(go list -m -f '{{.Version}}' google.golang.org/grpc 2>/dev/null || echo '?')), unary grpc.health.v1.Health/Check over h2c to scripts/grpcbackend"
	fi
	for mode in h2 grpc; do
		wants "$mode" || continue
		for proxy in "${proxies[@]}"; do
			[ -z "${mode_failed[$proxy $mode]:-}" ] || echo "$mode probe: $proxy left out: ${mode_failed[$proxy $mode]}"
		done
	done
	echo "on CPU 0 only: ${pinning%, } (hotproxy with GOMAXPROCS=1)"
	echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/environment.txt"
[ "$nginx_stream" = none ] && echo "nginx has no stream module here: it is left out of the TCP test" | tee -a "$out/environment.txt"

echo "warm-up: ${warmup} per proxy and mode, not counted"
for proxy in "${proxies[@]}"; do
	for mode in "${http_modes[@]}"; do
		alive "$proxy" || true
		[ -z "$(skip_reason "$proxy" "$mode")" ] || continue
		wrk_run "$proxy" "$mode" "$warmup" || echo "bench-peers: warm-up, $proxy $mode: $wrk_out" | tee -a "$failures" >&2
	done
done

# Idle keep-alive connections: measured right after the warm-up, one proxy
# at a time, before the rounds leave thousands of sockets in TIME_WAIT.
mem_raw=$out/memory.tsv
printf 'proxy\tconns\tpss_before_kb\tpss_after_kb\trss_before_kb\trss_after_kb\tpss_kb_per_conn\trss_kb_per_conn\n' >"$mem_raw"
wants memory && echo "memory: ${idle_conns} idle keep-alive connections per proxy"
for proxy in "${proxies[@]}"; do
	wants memory || break
	alive "$proxy" || continue
	pids=$(bench_tree_pids "${proxy_pid[$proxy]}" | paste -sd, -)
	if ! result=$(taskset -c 1 "$work/idleconns" -addr "127.0.0.1:${http_port[$proxy]}" -conns "$idle_conns" -pids "$pids" 2>&1); then
		echo "bench-peers: measuring idle connections through $proxy failed: $result" | tee -a "$failures" >&2
		continue
	fi
	alive "$proxy" || continue
	printf '%s\t%s\n' "$proxy" "$(tr ' ' '\n' <<<"$result" | cut -d= -f2 | paste -sd '\t' -)" >>"$mem_raw"
	printf '  %-9s %s\n' "$proxy" "$result"
done

# A burst (issue 22): BURST_CONNS connections, then every request at once,
# all sent before any response is read, then idle; RSS of the proxy's
# tree 6 s later. Also before the rounds, one proxy at a time, each
# restarted first: memory an earlier mode left in its heap would be
# reused by the burst and hide what the burst costs.
burst_raw=$out/burst.tsv
printf 'proxy\tconns\tpss_before_kb\tpss_after_kb\trss_before_kb\trss_after_kb\tpss_kb_per_conn\trss_kb_per_conn\n' >"$burst_raw"
wants burst && echo "burst: ${burst_conns} simultaneous first requests per proxy, then idle for 6 s"
for proxy in "${proxies[@]}"; do
	wants burst || break
	alive "$proxy" || continue
	stop_pid "${proxy_pid[$proxy]}"
	start_proxy "$proxy"
	alive "$proxy" || continue
	pids=$(bench_tree_pids "${proxy_pid[$proxy]}" | paste -sd, -)
	if ! result=$(taskset -c 1 "$work/idleconns" -burst -settle 6s -timeout 30s -addr "127.0.0.1:${http_port[$proxy]}" -conns "$burst_conns" -pids "$pids" 2>&1); then
		echo "bench-peers: measuring a burst through $proxy failed: $result" | tee -a "$failures" >&2
		continue
	fi
	alive "$proxy" || continue
	printf '%s\t%s\n' "$proxy" "$(tr ' ' '\n' <<<"$result" | cut -d= -f2 | paste -sd '\t' -)" >>"$burst_raw"
	printf '  %-9s %s\n' "$proxy" "$result"
done

# System calls per request (issue 22): SYSCALL_REQUESTS requests through
# each proxy with h2load (a fixed count, which wrk cannot do), keep-alive
# (CONNECTIONS connections) and then a connection per request (Connection:
# close: the proxy closes, h2load reconnects), under strace -c -f attached
# to every process of the proxy's tree. strace slows the proxy several
# times over, so these are counts, not costs: a slower proxy finds more
# work waiting per wake, so its wake-ups (epoll_wait, futex) per request
# can come out lower than unstraced.
sys_dir=$out/syscalls
sys_raw=$out/syscalls.tsv
printf 'proxy\tmode\trequests\tsyscall\tcalls\terrors\tcalls_per_req\terrors_per_req\n' >"$sys_raw"
# syscalls_run PROXY MODE: one straced h2load run; its rows go to $sys_raw.
syscalls_run() {
	local proxy=$1 mode=$2 args=() pids=() p i strace_pid done_n result
	alive "$proxy" || return 0
	[ "$mode" = close ] && args=(-H "Connection: close")
	for p in $(bench_tree_pids "${proxy_pid[$proxy]}"); do pids+=(-p "$p"); done
	mkdir -p "$sys_dir"
	: >"$sys_dir/$proxy-$mode.attach" # before strace, so that the wait below can read it at once
	strace -c -f -o "$sys_dir/$proxy-$mode.strace" "${pids[@]}" 2>"$sys_dir/$proxy-$mode.attach" &
	strace_pid=$!
	# Wait until strace says it has attached to every process (with all
	# its threads: "Process N attached with M threads"), at most 10 s.
	for ((i = 0; i < 200; i++)); do
		[ "$(grep -c 'attached' "$sys_dir/$proxy-$mode.attach")" -ge $((${#pids[@]} / 2)) ] && break
		sleep 0.05
	done
	result=$(taskset -c 1 h2load --h1 -n "$syscall_requests" -c "$connections" -t 1 "${args[@]}" "http://127.0.0.1:${http_port[$proxy]}/" 2>&1) || true
	kill -INT "$strace_pid" 2>/dev/null || true
	wait "$strace_pid" 2>/dev/null || true
	echo "$result" >"$sys_dir/$proxy-$mode.h2load"
	done_n=$(sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' <<<"$result")
	if [ -z "$done_n" ] || [ "$done_n" -lt "$syscall_requests" ]; then
		echo "bench-peers: syscalls, $proxy $mode: ${done_n:-no} requests of $syscall_requests succeeded: $(grep -m1 '^requests:' <<<"$result")" | tee -a "$failures" >&2
		[ -n "$done_n" ] && [ "$done_n" -gt 0 ] || return 0
	fi
	# strace -c: "% time seconds usecs/call calls [errors] syscall", a
	# dashed line, and a total line.
	awk -v p="$proxy" -v m="$mode" -v n="$done_n" '
		/^-/ || /^% time/ || /total$/ || NF < 5 {next}
		{calls = $4; errs = (NF == 6 ? $5 : 0); name = $NF
		 printf "%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\n", p, m, n, name, calls, errs, calls / n, errs / n}' \
		"$sys_dir/$proxy-$mode.strace" >>"$sys_raw"
	printf '  %-9s %-9s %s requests: %s system calls per request\n' "$proxy" "$mode" "$done_n" \
		"$(awk -F'\t' -v p="$proxy" -v m="$mode" '$1 == p && $2 == m {s += $5} END {printf "%.2f", s / '"$done_n"'}' "$sys_raw")"
}
wants syscalls && echo "syscalls: ${syscall_requests} requests per proxy and mode under strace -c -f (h2load --h1 -c${connections})"
for mode in keepalive close; do
	wants syscalls || break
	for proxy in "${proxies[@]}"; do syscalls_run "$proxy" "$mode"; done
done

for ((round = 1; round <= rounds; round++)); do
	# Rotate who goes first, and alternate which mode does.
	order=()
	for ((i = 0; i < ${#proxies[@]}; i++)); do order+=("${proxies[(i + round - 1) % ${#proxies[@]}]}"); done
	round_modes=("${http_modes[@]}")
	if ((round % 2 == 0)); then
		round_modes=()
		for ((i = ${#http_modes[@]} - 1; i >= 0; i--)); do round_modes+=("${http_modes[i]}"); done
	fi
	echo "round ${round}/${rounds}: ${order[*]}; ${round_modes[*]}"
	for mode in "${round_modes[@]}"; do
		for proxy in "${order[@]}"; do http_run "$round" "$proxy" "$mode"; done
	done
	for proxy in "${order[@]}"; do
		wants tcp || break
		if [[ " ${tcp_proxies[*]} " == *" $proxy "* ]]; then tcp_run "$round" "$proxy"; fi
	done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/environment.txt"

# --- summary --------------------------------------------------------------

# median FILE PROXY COLUMN [MODE]: the median of a numeric column of a raw
# table over the rounds (rows whose value is not a number are skipped).
median() {
	awk -F'\t' -v p="$2" -v c="$3" -v m="${4:-}" \
		'NR > 1 && $2 == p && (m == "" || $3 == m) && $c ~ /^[0-9.]+$/ {print $c}' "$1" |
		sort -g | awk '{v[NR] = $1} END {
			if (NR == 0) print "-"
			else if (NR % 2) print v[(NR + 1) / 2]
			else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2
		}'
}

# ratio A B: A / B to two places, or "-" if either is missing.
ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN {
		if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b + 0 == 0) print "-"; else printf "%.2f", a / b
	}'
}

# better HIGHER|LOWER A B: the better of two figures ("-" loses).
better() {
	awk -v w="$1" -v a="$2" -v b="$3" 'BEGIN {
		if (a !~ /^[0-9.]+$/) print b; else if (b !~ /^[0-9.]+$/) print a
		else if (w == "HIGHER") print (a + 0 > b + 0 ? a : b); else print (a + 0 < b + 0 ? a : b)
	}'
}

# paired COLUMN HIGHER|LOWER MODE: round by round, hotproxy's figure over
# the better peer's of the same round, whose runs were back to back:
# "median (lowest-highest, N rounds)", or "-". The medians above compare
# runs up to a round apart, over which a shared machine's speed drifts.
paired() {
	awk -F'\t' -v c="$1" -v w="$2" -v m="$3" '
		NR > 1 && $3 == m && $c ~ /^[0-9.]+$/ {v[$1, $2] = $c; r[$1] = 1}
		END {
			n = 0
			for (k in r) {
				h = v[k, "hotproxy"]; a = v[k, "nginx"]; b = v[k, "haproxy"]
				if (h == "" || (a == "" && b == "")) continue
				if (a == "") best = b; else if (b == "") best = a
				else if (w == "HIGHER") best = (a + 0 > b + 0 ? a : b); else best = (a + 0 < b + 0 ? a : b)
				if (best + 0 == 0) continue
				x[++n] = h / best
			}
			if (n == 0) {print "-"; exit}
			for (i = 2; i <= n; i++) for (j = i; j > 1 && x[j] < x[j - 1]; j--) {t = x[j]; x[j] = x[j - 1]; x[j - 1] = t}
			med = (n % 2) ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
			printf "%.2f (%.2f-%.2f, %d rounds)\n", med, x[1], x[n], n
		}' "$http_raw"
}

# verdict RATIO OP BAR: "met" or "NOT met" for RATIO against the bar.
verdict() {
	awk -v r="$1" -v op="$2" -v bar="$3" 'BEGIN {
		if (r !~ /^[0-9.]+$/) print "-"
		else if ((op == "<=" && r + 0 <= bar + 0) || (op == ">=" && r + 0 >= bar + 0)) print "met"
		else print "NOT met"
	}'
}

{
	echo
	echo "HTTP, median of ${rounds} rounds (wrk -t1 -c${connections} -d${duration}; h2 and grpc: -c${h2_conns} -m${h2_streams} for ${h2_duration}, p99 of grpc from grpcload, none from h2load); CPU is the proxy's whole process tree; load % is CPU 1 busy (the load tool and the backend: at ~100 % they, not the proxy, set req/s) and load us/req that busy time per request (at ~100 %, req/s is one over it); segs/req the TCP segments the machine sent per request; steal % the hypervisor's steal of both CPUs (above ~1 % the machine, not the proxy, slowed the round)"
	printf '%-13s %-9s %12s %10s %12s %7s %7s %12s %9s %7s %8s %9s\n' mode proxy req/s "p99 ms" "CPU us/req" "core %" "load %" "load us/req" "segs/req" "steal %" errors "resumed"
	for mode in "${http_modes[@]}"; do
		for proxy in "${proxies[@]}"; do
			# A failed run counts as one error, so that it cannot pass for a clean one.
			errors=$(awk -F'\t' -v p="$proxy" -v m="$mode" 'NR > 1 && $2 == p && $3 == m {n += ($11 == "failed" ? 1 : $11)} END {print n + 0}' "$http_raw")
			resumed=$(median "$http_raw" "$proxy" 12 "$mode")
			[ "$resumed" = - ] || resumed="${resumed}%"
			printf '%-13s %-9s %12s %10s %12s %7s %7s %12s %9s %7s %8s %9s\n' "$mode" "$proxy" \
				"$(median "$http_raw" "$proxy" 4 "$mode")" "$(median "$http_raw" "$proxy" 5 "$mode")" \
				"$(median "$http_raw" "$proxy" 9 "$mode")" "$(median "$http_raw" "$proxy" 10 "$mode")" \
				"$(median "$http_raw" "$proxy" 13 "$mode")" "$(median "$http_raw" "$proxy" 16 "$mode")" \
				"$(median "$http_raw" "$proxy" 14 "$mode")" \
				"$(median "$http_raw" "$proxy" 15 "$mode")" "$errors" "$resumed"
		done
	done
	echo
	echo "hotproxy / the better of nginx and HAProxy (HTTP/1.1: issue 22's bars, CPU stricter than issue 10's 1.10 and 1.30, p99 issue 10's; TLS: issue 13's ratios, no bar; h2: issue 21's bars; grpc: no bar)"
	printf '%-13s %-11s %7s %-8s %s\n' mode figure ratio bar verdict
	for mode in "${http_modes[@]}"; do
		if [ "$mode" = h2 ] || [ "$mode" = grpc ]; then
			for figure in "req/s:4:HIGHER:>=:0.95" "p99:5:LOWER:-:-" "CPU us/req:9:LOWER:<=:1.10"; do
				IFS=: read -r name col want op bar <<<"$figure"
				[ "$mode" = h2 ] && [ "$name" = p99 ] && continue
				best=$(better "$want" "$(median "$http_raw" nginx "$col" "$mode")" "$(median "$http_raw" haproxy "$col" "$mode")")
				r=$(ratio "$(median "$http_raw" hotproxy "$col" "$mode")" "$best")
				if [ "$mode" = grpc ] || [ "$op" = - ]; then
					printf '%-13s %-11s %7s %-8s %s\n' "$mode" "$name" "$r" "-" "(no bar)"
				else
					printf '%-13s %-11s %7s %-8s %s\n' "$mode" "$name" "$r" "$op $bar" "$(verdict "$r" "$op" "$bar")"
				fi
			done
			continue
		fi
		if [[ $mode == tls-* ]]; then
			for figure in "req/s:4:HIGHER" "CPU us/req:9:LOWER"; do
				IFS=: read -r name col want <<<"$figure"
				best=$(better "$want" "$(median "$http_raw" nginx "$col" "$mode")" "$(median "$http_raw" haproxy "$col" "$mode")")
				printf '%-13s %-11s %7s %-8s %s\n' "$mode" "$name" "$(ratio "$(median "$http_raw" hotproxy "$col" "$mode")" "$best")" "-" "(no bar)"
			done
			continue
		fi
		printf '%-13s %-11s %s\n' "$mode" "req/s" "round by round: $(paired 4 HIGHER "$mode")"
		printf '%-13s %-11s %s\n' "$mode" "CPU us/req" "round by round: $(paired 9 LOWER "$mode")"
		cpu_bar=1.00
		[ "$mode" = close ] && cpu_bar=1.10
		for figure in "req/s:4:HIGHER:>=:0.95" "p99:5:LOWER:<=:1.00" "CPU us/req:9:LOWER:<=:$cpu_bar"; do
			IFS=: read -r name col want op bar <<<"$figure"
			best=$(better "$want" "$(median "$http_raw" nginx "$col" "$mode")" "$(median "$http_raw" haproxy "$col" "$mode")")
			r=$(ratio "$(median "$http_raw" hotproxy "$col" "$mode")" "$best")
			if [ "$name" = p99 ] && [ "$mode" = close ]; then
				printf '%-13s %-11s %7s %-8s %s\n' "$mode" "$name" "$r" "-" "(no bar)"
			else
				printf '%-13s %-11s %7s %-8s %s\n' "$mode" "$name" "$r" "$op $bar" "$(verdict "$r" "$op" "$bar")"
			fi
		done
	done

	if wants memory; then
		echo
		echo "memory per idle keep-alive connection (${idle_conns} connections; Pss of the process tree, VmRSS for reference)"
		printf '%-9s %12s %12s\n' proxy "Pss KB/conn" "RSS KB/conn"
		for proxy in "${proxies[@]}"; do
			printf '%-9s %12s %12s\n' "$proxy" \
				"$(awk -F'\t' -v p="$proxy" '$1 == p {print $7}' "$mem_raw")" "$(awk -F'\t' -v p="$proxy" '$1 == p {print $8}' "$mem_raw")"
		done
		mem() { awk -F'\t' -v p="$1" '$1 == p {print $7}' "$mem_raw"; }
		r=$(ratio "$(mem hotproxy)" "$(better LOWER "$(mem nginx)" "$(mem haproxy)")")
		printf 'hotproxy / better peer: %s; bar: <= 8 KB per connection: %s\n' "$r" \
			"$(verdict "$(mem hotproxy)" "<=" 8)"

	fi
	if wants burst; then
		echo
		echo "memory per connection 6 s after a burst (${burst_conns} simultaneous first requests, then idle; VmRSS of the process tree, Pss beside it)"
		printf '%-9s %12s %12s\n' proxy "RSS KB/conn" "Pss KB/conn"
		for proxy in "${proxies[@]}"; do
			printf '%-9s %12s %12s\n' "$proxy" \
				"$(awk -F'\t' -v p="$proxy" '$1 == p {print $8}' "$burst_raw")" "$(awk -F'\t' -v p="$proxy" '$1 == p {print $7}' "$burst_raw")"
		done
		burst_rss() { awk -F'\t' -v p="$1" '$1 == p {print $8}' "$burst_raw"; }
		r=$(ratio "$(burst_rss hotproxy)" "$(better LOWER "$(burst_rss nginx)" "$(burst_rss haproxy)")")
		printf 'hotproxy / better peer: %s; bar: <= 8 KiB per connection: %s\n' "$r" \
			"$(verdict "$(burst_rss hotproxy)" "<=" 8)"
	fi
	if wants syscalls; then
		for mode in keepalive close; do
			echo
			echo "system calls per request, $mode (strace -c -f, ${syscall_requests} requests with h2load --h1 -c${connections}; errors in brackets, most are EAGAIN)"
			printf '%-18s %14s %14s %14s\n' syscall "${proxies[@]}"
			awk -F'\t' -v m="$mode" -v order="${proxies[*]}" '
				NR > 1 && $2 == m {c[$4, $1] = $7; e[$4, $1] = $8; seen[$4] = 1; tot[$1] += $7; totd[$4] += $7}
				END {
					np = split(order, ps, " ")
					# Busiest first: by the sum over the proxies.
					n = 0; for (s in seen) names[++n] = s
					for (i = 2; i <= n; i++) for (j = i; j > 1 && totd[names[j]] > totd[names[j-1]]; j--) {t = names[j]; names[j] = names[j-1]; names[j-1] = t}
					for (i = 1; i <= n; i++) {
						line = sprintf("%-18s", names[i])
						for (k = 1; k <= np; k++) {
							v = ((names[i], ps[k]) in c) ? sprintf("%.2f", c[names[i], ps[k]]) : "-"
							if (((names[i], ps[k]) in e) && e[names[i], ps[k]] > 0) v = v sprintf(" (%.2f)", e[names[i], ps[k]])
							line = line sprintf(" %14s", v)
						}
						print line
					}
					line = sprintf("%-18s", "total")
					for (k = 1; k <= np; k++) line = line sprintf(" %14s", (ps[k] in tot) ? sprintf("%.2f", tot[ps[k]]) : "-")
					print line
				}' "$sys_raw"
		done
	fi
	if wants tcp; then
		echo
		echo "TCP bulk, median of ${rounds} rounds of ${tcp_bytes} bytes through the TCP listener"
		printf '%-9s %12s %10s\n' proxy "CPU s/GiB" "MiB/s"
		for proxy in "${tcp_proxies[@]}"; do
			printf '%-9s %12s %10s\n' "$proxy" "$(median "$tcp_raw" "$proxy" 7)" "$(median "$tcp_raw" "$proxy" 5)"
		done
		[ "$nginx_stream" = none ] && echo "(nginx: no stream module, skipped)"
		hot=$(median "$tcp_raw" hotproxy 7)
		best=$(median "$tcp_raw" haproxy 7)
		[ "$nginx_stream" != none ] && best=$(better LOWER "$best" "$(median "$tcp_raw" nginx 7)")
		r=$(ratio "$hot" "$(median "$tcp_raw" haproxy 7)")
		printf 'hotproxy / HAProxy: %s; bar: <= 1.10: %s; hotproxy / better peer: %s\n' "$r" "$(verdict "$r" "<=" 1.10)" "$(ratio "$hot" "$best")"
	fi
	if [ -s "$failures" ]; then
		echo
		echo "left out, and why:"
		sed 's/^bench-peers: /  /' "$failures"
	fi
} | tee "$out/summary.txt"

echo
echo "bench-peers: raw numbers and this summary are in $out"
