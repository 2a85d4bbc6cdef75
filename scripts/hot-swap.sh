#!/bin/sh
# hot-swap.sh: upgrade a running hotproxy to a new binary without dropping a
# connection.
#
#   scripts/hot-swap.sh [--no-supervisor] NEW_BINARY [reload flags...]
#
# 1. Installs NEW_BINARY atomically over the installed binary
#    ($HOTPROXY_INSTALL_PATH, default: /usr/local/bin/hotproxy): a copy in a
#    temporary file of the same directory, chmod, then rename(2) over the old
#    path. Running processes keep their (old) image; the old file is kept as
#    PATH.prev.
# 2. Runs `hotproxy reload`: the supervisor starts the next generation from
#    the new file; it takes over the listening sockets and the old one drains.
#    If that fails, the old binary is renamed back and the script exits 1
#    (the old generation still serves).
# 3. Unless --no-supervisor: `hotproxy reload --supervisor`, so that the
#    supervisor re-executes itself from the new file too (same pid, children
#    kept).
#
# Reload flags (--base-id B, --control-socket PATH, --timeout D) are passed to
# `hotproxy reload`. Exit status: 0 when the new binary serves.
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
target=${HOTPROXY_INSTALL_PATH:-/usr/local/bin/hotproxy}

if [ ! -f "$new" ] || [ ! -x "$new" ]; then
	echo "hot-swap: $new is not an executable file" >&2
	exit 2
fi
# A binary that cannot even print its version is not installed.
if ! newver=$("$new" version 2>&1 | head -n 1); then
	echo "hot-swap: $new version failed: $newver" >&2
	exit 1
fi

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
echo "hot-swap: installed $newver at $target"

if ! "$target" reload "$@"; then
	if [ -e "$target.prev" ]; then
		mv -f "$target.prev" "$target"
		echo "hot-swap: reload failed; restored the previous binary at $target (the old generation still serves)" >&2
	fi
	exit 1
fi
if [ "$supervisor" = 1 ]; then
	"$target" reload --supervisor "$@"
fi
