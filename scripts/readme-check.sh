#!/usr/bin/env bash
# Runs the README's commands literally, in order, on a fresh clone: the
# sh blocks of "Set up", "A quick tour", "Hot restart" and "The
# supervisor". Each command must exit 0. What cannot run as written is said,
# never silently dropped:
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
#
# As root it runs in its own network and mount namespaces (unshare), with
# private /dev/shm and /run/hotproxy, so the README's fixed ports and
# base-id 0 cannot collide with anything else on the machine.
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
		mkdir -p /run/hotproxy && mount -t tmpfs tmpfs /run/hotproxy
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

# Extract the sh blocks of the chosen sections, one command per line.
awk '
	/^#+ / { sec = $0; sub(/^#+ /, "", sec); next }
	/^```sh$/ { inblock = (sec == "Set up" || sec == "A quick tour" || sec == "Hot restart" || sec == "The supervisor"); if (inblock) print "#BLOCK " sec; next }
	/^```$/ { if (inblock) print "#END " sec; inblock = 0; next }
	inblock { print }
' "$work/clone/README.md" >"$work/commands"

makerun=""
while IFS= read -r line; do
	case "$line" in
	"#BLOCK "*) echo "echo; echo '## ${line#\#BLOCK }'" >>"$script"; continue ;;
	"#END Set up")
		# "Ctrl-C drains and stops it": once the block after make run's
		# is done.
		case $makerun in
		1) makerun=2 ;;
		2)
			echo 'step "Ctrl-C (SIGINT to make run)"; kill -INT -- -$makerun_pid; gone $makerun_pid' >>"$script"
			makerun="" ;;
		esac
		continue ;;
	"#END "*) continue ;;
	esac
	cmd=${line%%#*}                       # the command without its comment
	cmd="${cmd%"${cmd##*[![:space:]]}"}"  # trailing blanks
	[[ -n $cmd ]] || continue
	q=$(printf '%q' "$cmd")
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
