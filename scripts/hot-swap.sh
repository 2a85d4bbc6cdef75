#!/bin/sh
# hot-swap.sh: upgrade a running hotproxy to a new binary without dropping a
# connection.
#
#   scripts/hot-swap.sh [--no-supervisor] NEW_BINARY [reload flags...]
#
# 1. Asks the running supervisor (`hotproxy status`) which file it starts
#    generations from: that is where NEW_BINARY goes, since a reload starts
#    the next generation from it. $HOTPROXY_INSTALL_PATH, if set, must be
#    that file (or a link to it): otherwise the script says so and installs
#    nothing, because the reload would run the old binary again.
# 2. Installs NEW_BINARY there atomically: a copy in a temporary file of the
#    same directory, chmod, then rename(2) over the old path. Running
#    processes keep their (old) image; the old file is kept as PATH.prev.
# 3. Runs `hotproxy reload`: the supervisor starts the next generation from
#    the new file; it takes over the listening sockets and the old one drains.
#    If that fails, the old binary is renamed back and the script exits 1
#    (the old generation still serves).
# 4. Checks that the generation serving now runs NEW_BINARY (its
#    /proc/PID/exe has the same bytes; where that cannot be read, its version
#    is NEW_BINARY's), and exits 1 saying so if not.
# 5. Unless --no-supervisor: `hotproxy reload --supervisor`, so that the
#    supervisor re-executes itself from the new file too (same pid, children
#    kept); a supervisor that runs from another file than its generations
#    (supervise --generation-binary) keeps its version, and the script says so.
#
# Reload flags (--base-id B, --control-socket PATH, --timeout D) are passed to
# `hotproxy reload`; --base-id and --control-socket to `hotproxy status` too.
# Exit status: 0 when the new binary serves.
set -eu

supervisor=1
if [ "${1:-}" = "--no-supervisor" ]; then
	supervisor=0
	shift
fi
if [ $# -lt 1 ]; then
	echo "usage: $0 [--no-supervisor] NEW_BINARY [hotproxy reload flags...]" >&2
	exit 2
fi
new=$1
shift

if [ ! -f "$new" ] || [ ! -x "$new" ]; then
	echo "hot-swap: $new is not an executable file" >&2
	exit 2
fi
# A binary that cannot even print its version is not installed.
if ! newver=$("$new" version 2>&1 | head -n 1); then
	echo "hot-swap: $new version failed: $newver" >&2
	exit 1
fi

# The flags that find the supervisor, for `hotproxy status`.
ctl=""
take=""
for a in "$@"; do
	if [ -n "$take" ]; then
		ctl="$ctl $take $a"
		take=""
		continue
	fi
	case $a in
	--base-id | -base-id | --control-socket | -control-socket) take=$a ;;
	--base-id=* | -base-id=* | --control-socket=* | -control-socket=*) ctl="$ctl $a" ;;
	esac
done

# 1. Where the running supervisor starts generations from.
# shellcheck disable=SC2086 # ctl is a list of flags without blanks in them
if ! status=$("$new" status --json $ctl 2>&1); then
	echo "hot-swap: no running supervisor answers ($status): nothing installed" >&2
	exit 1
fi
# The top-level "binary" field (indented two spaces; the generations'
# are deeper).
running=$(printf '%s\n' "$status" | sed -n 's/^  "binary": "\(.*\)",\{0,1\}$/\1/p' | head -n 1)
if [ -z "$running" ]; then
	echo "hot-swap: the supervisor's status names no binary: nothing installed" >&2
	printf '%s\n' "$status" >&2
	exit 1
fi
target=${HOTPROXY_INSTALL_PATH:-$running}
if [ "$(readlink -f "$target")" != "$(readlink -f "$running")" ]; then
	cat >&2 <<EOF
hot-swap: NOT INSTALLED: the running supervisor starts its generations from
  $running
but HOTPROXY_INSTALL_PATH is
  $target
A reload would run the old binary again. Unset HOTPROXY_INSTALL_PATH (the
script then installs at the supervisor's path), or set it to that path.
EOF
	exit 1
fi
# A symlink (a deploy tool's "current") is followed: the file it names is
# replaced, the link is kept.
target=$(readlink -f "$target")

# 2. Install.
dir=$(dirname "$target")
tmp=$(mktemp "$dir/.hotproxy.swap.XXXXXX")
trap 'rm -f "$tmp"' EXIT
cp "$new" "$tmp"
chmod 0755 "$tmp"
if [ -e "$target" ]; then
	chown --reference="$target" "$tmp" 2>/dev/null || true
	# Keep the old binary for a rollback (a hard link: no copy, no window).
	ln -f "$target" "$target.prev"
fi
mv -f "$tmp" "$target"
trap - EXIT
echo "hot-swap: installed $newver at $target (the running supervisor's generation binary)"

# 3. Reload.
if ! "$target" reload "$@"; then
	if [ -e "$target.prev" ]; then
		mv -f "$target.prev" "$target"
		echo "hot-swap: reload failed; restored the previous binary at $target (the old generation still serves)" >&2
	fi
	exit 1
fi

# 4. What serves now. `hotproxy status` prints EPOCH PID STATE AGE VERSION.
# shellcheck disable=SC2086
serving=$("$target" status $ctl | awk '$3 == "serving" { print $2, $5; exit }')
pid=${serving%% *}
ver=${serving#* }
if [ -z "$serving" ]; then
	echo "hot-swap: FAILED: after the reload no generation serves (hotproxy status)" >&2
	exit 1
fi
if [ -r "/proc/$pid/exe" ] && cmp -s "/proc/$pid/exe" "$new" 2>/dev/null; then
	echo "hot-swap: pid $pid serves, running $new ($newver)"
elif [ "hotproxy $ver" = "$newver" ]; then
	echo "hot-swap: pid $pid serves, version $ver"
else
	echo "hot-swap: FAILED: the serving generation (pid $pid) runs version $ver, not $newver" >&2
	exit 1
fi

# 5. The supervisor itself.
if [ "$supervisor" = 1 ]; then
	"$target" reload --supervisor "$@"
	# shellcheck disable=SC2086
	supver=$("$target" status $ctl | sed -n 's/^supervisor pid [0-9]*, version \([^,]*\),.*/\1/p')
	if [ "hotproxy $supver" != "$newver" ]; then
		echo "hot-swap: WARNING: the supervisor re-executed but runs version $supver, not $newver: it runs from another file than its generations (supervise --generation-binary); install the new binary there too and run hotproxy reload --supervisor" >&2
	fi
fi
