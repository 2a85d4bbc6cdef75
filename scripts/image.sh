#!/usr/bin/env bash
# Builds the container image with no registry: a static hotproxy
# (CGO_ENABLED=0) and the few files it needs, assembled into a build
# context that the Dockerfile copies onto an empty image (FROM scratch).
# Nothing is pulled; the CA bundle for upstream TLS is the build machine's.
# `make image` runs it.
#
#   scripts/image.sh                      # docker, else podman; tag hotproxy:<version>
#   IMAGE=hotproxy:v2 scripts/image.sh    # another tag
#   ENGINE=podman scripts/image.sh
#   CONTEXT_ONLY=1 scripts/image.sh       # only the context (bin/image), no engine needed
set -euo pipefail
cd "$(dirname "$0")/.."

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
image=${IMAGE:-hotproxy:$version}
ctx=${IMAGE_CONTEXT:-bin/image}
# The CA bundle upstream TLS verifies against (Go reads this path first).
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
# The image's user: not root, and numeric in the Dockerfile's USER so that
# Kubernetes' runAsNonRoot can check it.
uid=10001

[[ -r $ca ]] || { echo "image: no CA bundle at $ca (install Debian's ca-certificates, or set CA_BUNDLE=FILE)" >&2; exit 1; }

rm -rf "$ctx"
root=$ctx/rootfs
install -d -m 0755 "$root/usr/local/bin" "$root/etc/hotproxy" "$root/etc/ssl/certs"
install -d -m 1777 "$root/tmp"
# The supervisor's control socket directory (/run/hotproxy), the
# Dockerfile gives it to the image's user.
install -d -m 0750 "$ctx/run-hotproxy"

# No -trimpath: with it, Go leaves -ldflags out of the build information,
# and the supervisor reads each generation's version from there
# (`hotproxy status`).
CGO_ENABLED=0 go build \
	-ldflags "-X github.com/hotproxy/hotproxy/internal/version.Version=$version" \
	-o "$root/usr/local/bin/hotproxy" ./cmd/hotproxy
# An image with no libc runs only a static binary: say so now, not as
# "no such file or directory" from the engine.
if command -v readelf >/dev/null && readelf -l "$root/usr/local/bin/hotproxy" | grep -q 'INTERP'; then
	echo "image: $root/usr/local/bin/hotproxy is dynamically linked; build it with CGO_ENABLED=0" >&2
	exit 1
fi
install -m 0644 "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
install -m 0644 docker/hotproxy.toml "$root/etc/hotproxy/hotproxy.toml"
printf 'root:x:0:0:root:/:/nonexistent\nhotproxy:x:%d:%d:hotproxy:/nonexistent:/nonexistent\n' "$uid" "$uid" >"$root/etc/passwd"
printf 'root:x:0:\nhotproxy:x:%d:\n' "$uid" >"$root/etc/group"
chmod 0644 "$root/etc/passwd" "$root/etc/group"
cp Dockerfile "$ctx/Dockerfile"

if [[ -n ${CONTEXT_ONLY:-} ]]; then
	echo "image: context in $ctx"
	exit 0
fi
engine=${ENGINE:-}
if [[ -z $engine ]]; then
	for e in docker podman; do
		if command -v "$e" >/dev/null && "$e" info >/dev/null 2>&1; then engine=$e; break; fi
	done
fi
[[ -n $engine ]] || { echo "image: no container engine answers (docker or podman, with its daemon or socket); the context is in $ctx" >&2; exit 1; }

"$engine" build --build-arg VERSION="$version" -t "$image" "$ctx"
size=$("$engine" image inspect -f '{{.Size}}' "$image")
echo "image: $image built with $engine: $((size / 1024 / 1024)) MiB ($size bytes)"
