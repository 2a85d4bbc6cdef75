#!/usr/bin/env bash
# Builds the container image and checks that it serves through a published
# port and becomes healthy. Needs docker or podman; where neither is
# installed it says so and exits 0 (a skip, not a pass: the message says
# what was not checked).
#
#   scripts/docker-check.sh            # docker, else podman
#   ENGINE=podman scripts/docker-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

engine=${ENGINE:-}
if [[ -z $engine ]]; then
	for e in docker podman; do
		if command -v "$e" >/dev/null && "$e" info >/dev/null 2>&1; then engine=$e; break; fi
	done
fi
if [[ -z $engine ]]; then
	echo "docker-check: SKIP: no usable container engine (docker or podman, with its daemon/socket) on this machine; the image was not built"
	exit 0
fi

tag=hotproxy:ci-check
name=hotproxy-ci-check-$$
echo "docker-check: building $tag with $engine"
IMAGE=$tag ENGINE=$engine scripts/image.sh
trap '"$engine" rm -f "$name" >/dev/null 2>&1 || true' EXIT
# Port 0 on the host: the engine picks a free one.
"$engine" run -d --name "$name" -p 127.0.0.1::8080 "$tag" >/dev/null
port=$("$engine" port "$name" 8080/tcp | head -n1 | sed 's/.*://')
[[ -n $port ]] || { echo "docker-check: FAIL: the engine published no port for 8080/tcp"; exit 1; }

# Bounded wait: 30 tries, 1 s apart.
for i in $(seq 1 30); do
	if body=$(curl -fsS --max-time 2 "http://127.0.0.1:$port/" 2>/dev/null); then
		echo "docker-check: 127.0.0.1:$port answered: $body"
		break
	fi
	if ((i == 30)); then
		echo "docker-check: FAIL: nothing answered on 127.0.0.1:$port (-p 8080) within 30s"
		"$engine" logs "$name" || true
		exit 1
	fi
	sleep 1
done
[[ $body == hotproxy* ]] || { echo "docker-check: FAIL: unexpected answer: $body"; exit 1; }

for i in $(seq 1 30); do
	health=$("$engine" inspect -f '{{.State.Health.Status}}' "$name" 2>/dev/null || echo unknown)
	[[ $health == healthy ]] && { echo "docker-check: container is healthy"; exit 0; }
	sleep 1
done
echo "docker-check: FAIL: container not healthy within 30s (last: $health)"
"$engine" logs "$name" || true
exit 1
