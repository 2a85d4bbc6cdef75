# hotproxy in a container: `hotproxy supervise` is PID 1 (it reaps every
# child, forwards SIGUSR1, drains on SIGTERM). See docs/containers.md.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t hotproxy .
#   docker run -d --name hp -p 8080:8080 --stop-timeout 60 hotproxy
#   curl 127.0.0.1:8080/           # the baked-in docker/hotproxy.toml answers itself
#   # your config: -v $PWD/hotproxy.toml:/etc/hotproxy/hotproxy.toml:ro
#   docker kill -s HUP hp          # reload (or: docker exec hp hotproxy reload)
#   docker exec hp hotproxy status
#
# Built by .ci/run (scripts/docker-check.sh) where a container engine is
# installed; skipped with a message where none is.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
        -ldflags "-X github.com/hotproxy/hotproxy/internal/version.Version=${VERSION}" \
        -o /out/hotproxy ./cmd/hotproxy \
    && /out/hotproxy version

FROM debian:bookworm-slim
RUN useradd --system --no-create-home --shell /usr/sbin/nologin --uid 10001 hotproxy \
    && install -d -o hotproxy -g hotproxy -m 0750 /run/hotproxy \
    && install -d -m 0755 /etc/hotproxy
COPY --from=build /out/hotproxy /usr/local/bin/hotproxy
# Listens on 0.0.0.0:8080 (what -p reaches) and answers directly: the
# examples/ config listens on loopback and routes to backends that do not
# exist in a container.
COPY docker/hotproxy.toml /etc/hotproxy/hotproxy.toml
COPY scripts/hot-swap.sh /usr/local/bin/hotproxy-hot-swap
USER hotproxy
# docker stop: SIGTERM to PID 1, which drains every generation within
# server.parent_shutdown_time (45s by default) + 5s. Give it that long:
# `docker run --stop-timeout 60`, or terminationGracePeriodSeconds: 60.
STOPSIGNAL SIGTERM
EXPOSE 8080
# Healthy while a generation serves: server.live is 1 in the shared-memory
# stats, read by `hotproxy stats` without asking the proxy (no curl in the
# image, and the admin API stays on loopback). /ready on the admin API says
# the same; to probe it from outside the container, set [admin] address =
# "0.0.0.0:9901" and allow_remote = true, and keep 9901 unpublished or
# firewalled.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD hotproxy stats -c /etc/hotproxy/hotproxy.toml --filter '^server\.live$' | grep -qx 'server.live: 1'
ENTRYPOINT ["/usr/local/bin/hotproxy", "supervise", "-c", "/etc/hotproxy/hotproxy.toml"]
