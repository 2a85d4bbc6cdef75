#!/usr/bin/env bash
# Sends the request-smuggling cases of internal/smuggle over raw sockets to
# hotproxy, nginx and HAProxy, each configured as a reverse proxy in front
# of the same capture backend, and prints per case what each proxy
# answered and what reached the backend (issue 8, items 1-4); then the
# HTTP/2 cases (issue 20, item 4) to each one's cleartext HTTP/2 listener.
#
#   scripts/smuggle-check.sh            # hotproxy, nginx and haproxy
#   PROXIES=hotproxy scripts/smuggle-check.sh
#
# It fails when hotproxy does not refuse every case strictly (its status,
# one response, the connection closed, nothing forwarded), or when the
# hidden request of a case reaches the backend through any proxy. Installs
# nginx and haproxy with apt-get if missing. Everything on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

proxies=${PROXIES:-hotproxy nginx haproxy}
port_base=${PORT_BASE:-19300}
backend_port=$port_base
work=$(mktemp -d /tmp/smuggle-check.XXXXXX)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

for p in $proxies; do
	case $p in
	nginx) bench_install nginx:nginx ;;
	haproxy) bench_install haproxy:haproxy ;;
	hotproxy) make -s build ;;
	*) echo "smuggle-check: unknown proxy $p (hotproxy, nginx or haproxy)" >&2; exit 2 ;;
	esac
done
go build -o "$work/" ./scripts/smugglecheck

port_of() { # PROXY -> its listening port
	case $1 in hotproxy) echo $((port_base + 1)) ;; nginx) echo $((port_base + 2)) ;; haproxy) echo $((port_base + 3)) ;; esac
}
h2_port_of() { # PROXY -> its cleartext HTTP/2 (prior knowledge) port
	case $1 in hotproxy) echo $((port_base + 1)) ;; nginx) echo $((port_base + 5)) ;; haproxy) echo $((port_base + 6)) ;; esac
}

cat >"$work/hotproxy.toml" <<TOML
[admin]
address = "127.0.0.1:$((port_base + 4))"
[log]
level = "warn"
[stats]
path = "$work/hotproxy.stats"
[[listeners]]
name = "web"
address = "127.0.0.1:$(port_of hotproxy)"
protocol = "http"
http2_cleartext = true
  [[listeners.routes]]
  prefix = "/"
  cluster = "capture"
[[clusters]]
name = "capture"
endpoints = ["127.0.0.1:$backend_port"]
TOML

mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<NGINX
daemon off;
master_process off;
user root;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    upstream capture { server 127.0.0.1:$backend_port; keepalive 8; }
    server {
        listen 127.0.0.1:$(port_of nginx);
        listen 127.0.0.1:$(h2_port_of nginx) http2;
        location / {
            proxy_pass http://capture;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGINX

cat >"$work/haproxy.cfg" <<HAPROXY
defaults
    mode http
    timeout connect 5s
    timeout client 10s
    timeout server 10s
    http-reuse always
frontend web
    bind 127.0.0.1:$(port_of haproxy)
    bind 127.0.0.1:$(h2_port_of haproxy) proto h2
    default_backend capture
backend capture
    server capture 127.0.0.1:$backend_port
HAPROXY

status=0
for p in $proxies; do
	case $p in
	hotproxy) bin/hotproxy serve -c "$work/hotproxy.toml" --base-id $((30000 + $$ % 10000)) 2>"$work/hotproxy.log" & ;;
	nginx) nginx -c "$work/nginx/nginx.conf" 2>"$work/nginx.log" & ;;
	haproxy) haproxy -f "$work/haproxy.cfg" 2>"$work/haproxy.log" & ;;
	esac
	pid=$!
	pids+=("$pid")
	if ! bench_wait_tcp "$(port_of "$p")"; then
		echo "smuggle-check: $p did not start listening:" >&2
		cat "$work/$p.log" >&2 || true
		exit 1
	fi
	strict=()
	[ "$p" = hotproxy ] && strict=(-strict)
	if ! "$work/smugglecheck" -name "$p" -proxy "127.0.0.1:$(port_of "$p")" -backend "127.0.0.1:$backend_port" -h2 "127.0.0.1:$(h2_port_of "$p")" "${strict[@]}"; then
		status=1
	fi
	echo
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
done
exit $status
