#!/usr/bin/env bash
# Runs the commands a user is told to run, literally, in order, on a fresh
# clone: every sh block of README.md, then of systemd/README.md and
# docs/*.md. Each command must exit 0. A block this script does not know
# fails the check (teach it below), so a new recipe is never silently left
# out. What cannot run as written is said, never silently dropped:
#   make run        runs in the background (the README runs the next block
#                   "from another shell"), and Ctrl-C is sent to it after
#                   its block, as the README says
#   make test       skipped unless README_CHECK_MAKE_TEST=1 (the whole
#                   suite takes many minutes; CI runs it through .ci/run)
#   apt-get ...     run only as root; otherwise the tools are checked
#   NEW_BINARY      a placeholder: a binary built from the clone with
#                   version readme-check-swap takes its place, and after the
#                   line `hotproxy status` must show that version serving and
#                   supervising
#   serve, supervise without &: they run until Ctrl-C, so they are run,
#                   checked to serve, and sent SIGINT
# A command ending in & is waited for: its admin API (127.0.0.1:9901)
# answers /ready, with the epoch given by --restart-epoch.
# README "Stats from the command line": run against a live instance
#                   (supervise -c examples/hotproxy.toml, started for it),
#                   with `hotproxy` the clone's bin/hotproxy, the example
#                   paths (/etc/hotproxy/hotproxy.toml, /run/hp.stats,
#                   --base-id 3) made the live instance's, and the commands
#                   that run until Ctrl-C (--watch, top) interrupted after
#                   3s: they must have printed and still been running
# README "Development": benchmarks (scripts/*bench*, make bench), the
#                   smuggling comparison and long fuzzing take minutes and
#                   peers (wrk, nginx, HAProxy): skipped, said so
# systemd/README.md Install: its files installed into a temporary root and
#                   validated there, by integration/TestSystemdInstallRecipe
#                   (useradd and systemctl need the real system)
# systemd/README.md Reload: the validate line runs (on the example
#                   config); $EDITOR and systemctl are skipped, said so
# systemd/README.md Upgrade: the same scripts/hot-swap.sh as the README's
#                   supervisor block, which runs it for real above
# README "In a container", docs/containers.md: docker; run with a real
#                   engine by integration/docker_*_test.go in .ci/run
#                   (TestDockerReadme runs the README block as written)
# docs/benchmarks.md: run literally (/tmp/steering.test in the work dir)
#
# As root it runs in its own network and mount namespaces (unshare), with
# private /dev/shm and /run/hotproxy, so the README's fixed ports and
# base-id 0 cannot collide with anything else on the machine (/run/hotproxy
# mode 0700: the control socket's directory must be private, or supervise
# refuses it).
#
#   scripts/readme-check.sh                 # clones HEAD of this repository
#   README_CHECK_MAKE_TEST=1 scripts/readme-check.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"

if [[ ${README_CHECK_INNER:-} != 1 && $(id -u) -eq 0 ]] && command -v unshare >/dev/null; then
	exec unshare --net --mount --propagation private env README_CHECK_INNER=1 bash -c '
		set -e
		ip link set lo up
		mount -t tmpfs tmpfs /dev/shm
		mkdir -p /run/hotproxy && mount -t tmpfs -o mode=0700 tmpfs /run/hotproxy
		exec "$0" "$@"' "$0" "$@"
fi
[[ ${README_CHECK_INNER:-} == 1 ]] || echo "readme-check: not root (or no unshare): running without namespaces; ports 10000, 9901, 8080 and base-id 0 must be free"

export PATH="/usr/local/go/bin:$PATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/readme-check.XXXXXX")
script="$work/readme.sh"
trap 'rm -rf "$work"' EXIT
branch=$(git -C "$here" rev-parse --abbrev-ref HEAD)
git clone --quiet --branch "$branch" "$here" "$work/clone"
echo "readme-check: fresh clone of $branch ($(git -C "$work/clone" rev-parse --short HEAD)) in $work/clone"

# The generated script: helpers, then each README command in order.
cat >"$script" <<'EOF'
set -uo pipefail
set -m # each background job in its own process group, as in a shell
failed=0
ready() { # ready EPOCH: the admin API answers /ready and reports EPOCH
	for _ in $(seq 1 150); do
		if curl -sf --max-time 1 127.0.0.1:9901/ready >/dev/null &&
			curl -sf --max-time 1 127.0.0.1:9901/server_info | grep -Eq "\"epoch\": *$1\b"; then
			return 0
		fi
		sleep 0.1
	done
	echo "readme-check: FAIL: nothing ready with epoch $1 on 127.0.0.1:9901 within 15s"
	failed=1
	return 1
}
gone() { # gone PID: wait up to 30s for the process group to exit
	for _ in $(seq 1 300); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.1
	done
	echo "readme-check: FAIL: pid $1 still runs 30s after it was told to stop"
	failed=1
}
step() { echo; echo "\$ $*"; }
check() { # check STATUS COMMAND
	if [[ $1 -ne 0 ]]; then
		echo "readme-check: FAIL (exit $1): $2"
		failed=1
	fi
}
EOF

# Extract every sh block, one command per line, each block between
# "#BLOCK FILE|SECTION" and "#END FILE|SECTION" (a # line inside a block is
# a heading to awk only outside blocks).
(cd "$work/clone" && awk '
	FNR == 1 { sec = "" }
	!inblock && /^#+ / { sec = $0; sub(/^#+ /, "", sec); next }
	/^```sh$/ { inblock = 1; print "#BLOCK " FILENAME "|" sec; next }
	/^```$/ { if (inblock) print "#END " FILENAME "|" sec; inblock = 0; next }
	inblock { print }
' README.md systemd/README.md docs/*.md) >"$work/commands"

makerun=""
block=""
while IFS= read -r line; do
	case "$line" in
	"#BLOCK "*)
		block=${line#\#BLOCK }
		echo "echo; echo '## ${block//\'/}'" >>"$script"
		case $block in
		"README.md|Stats from the command line")
			cat >>"$script" <<'EOS'
step 'bin/hotproxy supervise -c examples/hotproxy.toml &  (the live instance the stats block reads; hotproxy is bin/hotproxy)'
bin/hotproxy supervise -c examples/hotproxy.toml >"$PWD/../stats-instance.log" 2>&1 & stats_pid=$!
ready 0 || cat "$PWD/../stats-instance.log"
hotproxy() { "$PWD/bin/hotproxy" "$@"; }
running_until_ctrl_c() { # COMMAND...: runs 3s, then SIGINT; it must have printed and still run
	local out rc bin=$1
	shift
	[[ $bin == hotproxy ]] && bin=$PWD/bin/hotproxy
	out=$(timeout -s INT 3 "$bin" "$@" 2>&1 </dev/null); rc=$?
	if [[ $rc -ne 124 || -z $out ]]; then
		echo "readme-check: FAIL: $* (exit $rc before Ctrl-C, or printed nothing):"; echo "$out"; failed=1
	else
		printf '%s\n' "$out" | head -n 12
	fi
}
EOS
			;;
		"systemd/README.md|Install")
			cat >>"$script" <<'EOS'
step 'the install recipe into a temporary root: go test -run TestSystemdInstallRecipe ./integration/'
go test -count=1 -run 'TestSystemdInstallRecipe$' ./integration/; check $? 'systemd/README.md install recipe'
EOS
			;;
		"systemd/README.md|Upgrade (new binary)")
			echo "echo 'readme-check: covered: scripts/hot-swap.sh ran for real in the README supervisor block above (and integration/TestHotSwapInstallsWhereTheSupervisorLooks)'" >>"$script" ;;
		"README.md|In a container" | docs/containers.md\|*)
			# A container engine, and minutes: .ci/run starts one and runs
			# the integration/docker_*_test.go tests, TestDockerReadme
			# among them, which runs the README's block as written.
			echo "echo 'readme-check: covered: docker commands run with a real engine by integration/docker_*_test.go in .ci/run (the README block as written by TestDockerReadme)'" >>"$script" ;;
		esac
		continue ;;
	"#END README.md|Stats from the command line")
		echo 'unset -f hotproxy; step "stop the stats instance"; kill -TERM $stats_pid; gone $stats_pid' >>"$script"
		block=""
		continue ;;
	"#END README.md|Set up")
		# "Ctrl-C drains and stops it": once the block after make run's
		# is done.
		case $makerun in
		1) makerun=2 ;;
		2)
			echo 'step "Ctrl-C (SIGINT to make run)"; kill -INT -- -$makerun_pid; gone $makerun_pid' >>"$script"
			makerun="" ;;
		esac
		continue ;;
	"#END "*) block=""; continue ;;
	esac
	cmd=${line%%#*}                       # the command without its comment
	cmd="${cmd%"${cmd##*[![:space:]]}"}"  # trailing blanks
	[[ -n $cmd ]] || continue
	q=$(printf '%q' "$cmd")
	case $block in
	"README.md|Set up" | "README.md|A quick tour" | "README.md|Hot restart" | "README.md|The supervisor" | "README.md|Following the demo control plane") ;; # below
	"README.md|Stats from the command line")
		run=${cmd//\/etc\/hotproxy\/hotproxy.toml/examples/hotproxy.toml}
		run=${run//\/run\/hp.stats//dev/shm/hotproxy.0.stats}
		run=${run//--base-id 3/--base-id 0}
		case $run in
		*--watch* | "hotproxy top"*) echo "step $q; running_until_ctrl_c $run" >>"$script" ;;
		*) echo "step $q; $run; check \$? $q" >>"$script" ;;
		esac
		continue ;;
	"README.md|Development")
		case $cmd in
		"make test") ;; # below
		*) echo "echo; echo 'readme-check: SKIP: ${cmd//\'/} (benchmarks, peers and long fuzzing: minutes; run by hand)'" >>"$script"; continue ;;
		esac ;;
	"systemd/README.md|Install" | "systemd/README.md|Upgrade (new binary)") continue ;; # done at #BLOCK
	"systemd/README.md|Reload (new config)")
		case $cmd in
		"hotproxy validate -c /etc/hotproxy/hotproxy.toml")
			echo "step $q' (the example config)'; bin/hotproxy validate -c examples/hotproxy.toml; check \$? $q" >>"$script" ;;
		*) echo "echo; echo 'readme-check: SKIP: ${cmd//\'/} (needs an editor, or systemd as init)'" >>"$script" ;;
		esac
		continue ;;
	"README.md|In a container" | docs/containers.md\|*) continue ;; # covered at #BLOCK
	docs/benchmarks.md\|*)
		run=${cmd//\/tmp\/steering.test/\$PWD/../steering.test}
		case $run in
		for\ *) loop=$run; continue ;; # a loop: gathered to its done
		done)
			echo "step $(printf '%q' "${loop} ... done"); $loop $lbody; done; check \$? 'the benchmark loop'" >>"$script"
			loop=""; lbody=""
			continue ;;
		esac
		if [[ -n ${loop:-} ]]; then lbody=$run; continue; fi
		echo "step $q; $run; check \$? $q" >>"$script"
		continue ;;
	*)
		echo "echo 'readme-check: FAIL: no rule for the sh block in ${block//\'/}: teach scripts/readme-check.sh to run it'; failed=1" >>"$script"
		continue ;;
	esac
	case "$cmd" in
	apt-get\ install*)
		if [[ $(id -u) -eq 0 ]]; then
			echo "step $q; DEBIAN_FRONTEND=noninteractive $cmd >/dev/null; check \$? $q" >>"$script"
		else
			echo "echo 'readme-check: not root: skipped $cmd; checking the tools instead'; for t in gcc make git curl unshare systemd-analyze python3; do command -v \$t >/dev/null || { echo \"readme-check: FAIL: \$t missing\"; failed=1; }; done" >>"$script"
		fi ;;
	"make test")
		if [[ ${README_CHECK_MAKE_TEST:-} == 1 ]]; then
			echo "step $q; $cmd; check \$? $q" >>"$script"
		else
			echo "echo; echo 'readme-check: SKIP: make test (the whole suite; README_CHECK_MAKE_TEST=1 runs it)'" >>"$script"
		fi ;;
	"make run")
		makerun=1
		echo "step '$cmd  (in the background: the next block runs from another shell)'; $cmd >\"\$PWD/../make-run.log\" 2>&1 & makerun_pid=\$!; ready 0 || cat \"\$PWD/../make-run.log\"" >>"$script" ;;
	*NEW_BINARY*)
		swapped=${cmd//NEW_BINARY/\$swap_bin}
		cat >>"$script" <<EOS
step $q' (NEW_BINARY: a build of this clone with version readme-check-swap)'
swap_bin=\$PWD/../hotproxy-swap
go build -ldflags "-X github.com/hotproxy/hotproxy/internal/version.Version=readme-check-swap" -o "\$swap_bin" ./cmd/hotproxy
check \$? 'go build NEW_BINARY'
$swapped; check \$? $q
st=\$(bin/hotproxy status)
if ! grep -q '^supervisor pid [0-9]*, version readme-check-swap,' <<<"\$st" || ! grep -Eq '^[0-9]+ +[0-9]+ +serving .* readme-check-swap\$' <<<"\$st"; then
	echo "readme-check: FAIL: after $cmd the new version does not serve:"; echo "\$st"; failed=1
fi
EOS
		;;
	*"&"|*"& "[a-z]*'=$!')
		epoch=0
		[[ $cmd =~ --restart-epoch\ ([0-9]+) ]] && epoch=${BASH_REMATCH[1]}
		printf 'step %s\n%s\nready %s\n' "$q" "$cmd" "$epoch" >>"$script" ;;
	"bin/hotproxy serve"|"bin/hotproxy serve "*|"bin/hotproxy supervise"|"bin/hotproxy supervise "*)
		# In the foreground until Ctrl-C: run it, check it serves, Ctrl-C.
		echo "step '$cmd  (until Ctrl-C)'; $cmd & fg_pid=\$!; ready 0; kill -INT -- -\$fg_pid; gone \$fg_pid" >>"$script" ;;
	kill\ *)
		# kill PID-or-$var, then wait for that process to be gone.
		echo "step $q; $cmd; check \$? $q; gone ${cmd#kill }" >>"$script" ;;
	*)
		echo "step $q; $cmd; check \$? $q" >>"$script" ;;
	esac
done <"$work/commands"
cat >>"$script" <<'EOF'
# Whatever is left running (a failed step) is stopped, by its own pid.
for pid in $(jobs -p); do kill -TERM -- -"$pid" 2>/dev/null; done
wait
echo
if [[ $failed -eq 0 ]]; then echo "readme-check: OK: every README command worked"; else echo "readme-check: FAILED"; fi
exit $failed
EOF

cd "$work/clone"
bash "$script"
