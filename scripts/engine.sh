#!/usr/bin/env bash
# A private Docker engine for the container tests, in a directory of its
# own: its data, its state, its socket and its pid file, and nothing else
# of the machine (no iptables rules, no bridge: the tests use --network
# host and --network container:NAME, all traffic on loopback).
#
#   scripts/engine.sh start DIR   # starts dockerd (waits at most 60s for its
#                                 # socket) and prints export DOCKER_HOST=...
#   scripts/engine.sh stop DIR    # stops it by its pid (SIGTERM, at most 30s,
#                                 # then SIGKILL), and its containerd, and
#                                 # removes DIR
#
# Needs root and dockerd (Debian: apt-get install docker.io). .ci/run uses
# it where no engine answers; by hand:
#   dir=$(mktemp -d); eval "$(scripts/engine.sh start "$dir")"
#   go test -count=1 -run '^TestDocker' ./integration/
#   scripts/engine.sh stop "$dir"
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
cmd=$1 dir=$2

# wait_gone PID TRIES: true once PID has exited, polling every 0.1s.
wait_gone() {
	local pid=$1 tries=$2 i
	for ((i = 0; i < tries; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	return 1
}

case $cmd in
start)
	[[ $(id -u) -eq 0 ]] || { echo "engine: dockerd needs root (run as root, or start an engine yourself and set DOCKER_HOST)" >&2; exit 1; }
	command -v dockerd >/dev/null || { echo "engine: no dockerd (Debian: apt-get install docker.io)" >&2; exit 1; }
	mkdir -p "$dir"
	sock=$dir/docker.sock
	dockerd --iptables=false --ip6tables=false --bridge=none \
		--data-root "$dir/data" --exec-root "$dir/exec" \
		--host "unix://$sock" --pidfile "$dir/docker.pid" \
		>"$dir/dockerd.log" 2>&1 </dev/null &
	pid=$!
	# Bounded: 600 tries 0.1s apart. The socket exists a moment before the
	# API answers on it, so ask the API.
	for ((i = 0; i < 600; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "engine: dockerd exited at start; its log ($dir/dockerd.log):" >&2
			tail -n 20 "$dir/dockerd.log" >&2
			exit 1
		fi
		if [[ -S $sock ]] && docker -H "unix://$sock" version >/dev/null 2>&1; then
			echo "export DOCKER_HOST=unix://$sock"
			exit 0
		fi
		sleep 0.1
	done
	echo "engine: dockerd (pid $pid) did not answer on $sock within 60s; stopping it. Its log ($dir/dockerd.log):" >&2
	tail -n 20 "$dir/dockerd.log" >&2
	kill "$pid" 2>/dev/null || true
	exit 1
	;;
stop)
	[[ -d $dir ]] || { echo "engine: no $dir: nothing to stop" >&2; exit 0; }
	# dockerd removes its pid file when it exits: none is nothing to stop.
	if [[ -f $dir/docker.pid ]]; then
		pid=$(cat "$dir/docker.pid")
		# dockerd stops its containers and the containerd it started; if it
		# has to be killed, that containerd is stopped by its own pid file.
		ctrd=$(cat "$dir/exec/containerd/containerd.pid" 2>/dev/null || true)
		kill -TERM "$pid" 2>/dev/null || true
		if ! wait_gone "$pid" 300; then
			echo "engine: dockerd (pid $pid) still runs 30s after SIGTERM: SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
			wait_gone "$pid" 50 || true
		fi
		if [[ -n $ctrd ]] && kill -0 "$ctrd" 2>/dev/null; then
			kill -TERM "$ctrd" 2>/dev/null || true
			wait_gone "$ctrd" 100 || kill -KILL "$ctrd" 2>/dev/null || true
		fi
	fi
	# dockerd pins the network namespace of containers on its default
	# network (none here, as --bridge=none) with a bind mount it leaves
	# behind: unmounting a namespace pin frees nothing that runs.
	awk -v d="$dir/" '$3 == "nsfs" && index($2, d) == 1 { print $2 }' /proc/self/mounts |
		while IFS= read -r m; do umount "$m" || true; done
	# Container mounts live under data/; dockerd unmounted them when it
	# stopped cleanly. What is still mounted is left, not forced.
	if grep -q " $dir/" /proc/self/mounts; then
		echo "engine: mounts remain under $dir; not removing it" >&2
		exit 0
	fi
	rm -rf "$dir"
	;;
*) usage ;;
esac
