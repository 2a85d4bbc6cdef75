# shellcheck shell=bash
# Pieces shared by the benchmark scripts (scripts/bench.sh,
# scripts/bench-peers.sh). Sourced, not run.

# bench_install COMMAND:PACKAGE...: installs with apt-get each package
# whose command is missing. Nothing is installed any other way.
bench_install() {
	local want=() pair
	for pair in "$@"; do
		command -v "${pair%%:*}" >/dev/null || want+=("${pair##*:}")
	done
	[ "${#want[@]}" -eq 0 ] || bench_apt_install "${want[@]}"
}

# bench_apt_install PACKAGE...: apt-get install, running apt-get update
# first, once per run of the script.
bench_apt_updated=0
bench_apt_install() {
	echo "installing $* with apt-get" >&2
	if [ "$bench_apt_updated" = 0 ]; then
		apt-get update -qq
		bench_apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# bench_wait_http URL [TRIES]: waits until URL answers 2xx, polling every
# 50ms at most TRIES times (default 200, i.e. 10s). Fails if it never does.
bench_wait_http() {
	local url=$1 tries=${2:-200} i
	for ((i = 0; i < tries; i++)); do
		curl -fs -o /dev/null --max-time 1 "$url" && return 0
		sleep 0.05
	done
	return 1
}

# bench_wait_tcp PORT [TRIES]: waits until 127.0.0.1:PORT accepts a
# connection, polling every 50ms at most TRIES times (default 200).
bench_wait_tcp() {
	local port=$1 tries=${2:-200} i
	for ((i = 0; i < tries; i++)); do
		# The connection is closed at once: the subshell exits.
		(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
		sleep 0.05
	done
	return 1
}

# bench_port_free PORT: succeeds if nothing listens on 127.0.0.1:PORT.
bench_port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# bench_tree_pids PID: PID and all its descendants, one a line.
bench_tree_pids() {
	local child
	echo "$1"
	for child in $(cat /proc/"$1"/task/*/children 2>/dev/null || true); do
		bench_tree_pids "$child"
	done
}

# bench_tree_ticks PID: the CPU time of PID's whole process tree in clock
# ticks (getconf CLK_TCK a second): utime + stime of each process (all its
# threads, live and exited), plus cutime + cstime, the time of children it
# has reaped, so that a worker that exits during a run still counts.
bench_tree_ticks() {
	local total=0 pid line fields
	for pid in $(bench_tree_pids "$1"); do
		line=$(cat /proc/"$pid"/stat 2>/dev/null) || continue
		# The fields after "(comm) ", which may itself hold spaces and
		# parentheses: state is fields[0], so field N of proc(5) is
		# fields[N-3]; utime is field 14.
		read -ra fields <<<"${line##*) }"
		total=$((total + fields[11] + fields[12] + fields[13] + fields[14]))
	done
	echo "$total"
}

# bench_cpu_ticks CPU: "busy total" clock ticks of CPU since boot, from
# /proc/stat (busy: everything but idle and iowait).
bench_cpu_ticks() {
	awk -v c="cpu$1" '$1 == c {t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t}' /proc/stat
}

# bench_cpu_steal: "steal total" clock ticks of all CPUs together since
# boot, from /proc/stat: steal is time a virtual machine's CPU wanted to
# run and the hypervisor ran something else (counted as busy by
# bench_cpu_ticks, and it slows whatever ran then).
bench_cpu_steal() {
	awk '$1 == "cpu" {t = 0; for (i = 2; i <= NF; i++) t += $i; print $9, t}' /proc/stat
}

# bench_tcp_segments: TCP segments sent by the whole machine since boot
# (Tcp OutSegs in /proc/net/snmp; on loopback every segment sent is also
# one received).
bench_tcp_segments() {
	awk '$1 == "Tcp:" && !h {for (i = 2; i <= NF; i++) if ($i == "OutSegs") c = i; h = 1; next}
		$1 == "Tcp:" && h {print $c; exit}' /proc/net/snmp
}
