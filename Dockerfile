# hotproxy's container image: a static binary and the few files it needs on
# an empty image. Built by `make image` (scripts/image.sh), which assembles
# the build context in bin/image from this source tree and the build
# machine's CA bundle: no registry, no base image, no shell in the image.
# See docs/containers.md.
#
#   make image                                   # hotproxy:<git describe>
#   docker run -d --name hp -p 8080:8080 --stop-timeout 60 hotproxy:<version>
#   curl 127.0.0.1:8080/                         # the baked-in docker/hotproxy.toml answers itself
#   # your config: -v $PWD/hotproxy.toml:/etc/hotproxy/hotproxy.toml:ro
#   docker kill -s HUP hp                        # reload (or: docker exec hp hotproxy reload)
#   docker exec hp hotproxy status
#
# `hotproxy supervise` is PID 1: it reaps every child, forwards SIGUSR1,
# drains on SIGTERM. Tested with a real engine by integration/docker_*_test.go
# (run by .ci/run, which starts dockerd where none runs).
FROM scratch
ARG VERSION=dev
LABEL org.opencontainers.image.title="hotproxy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/hotproxy/hotproxy"
# /usr/local/bin/hotproxy, /etc/passwd and /etc/group (uid 10001
# "hotproxy"), /etc/ssl/certs/ca-certificates.crt, /etc/hotproxy/hotproxy.toml
# (docker/hotproxy.toml: listens on 0.0.0.0:8080, what -p reaches, and
# answers directly), /tmp.
COPY rootfs/ /
# The supervisor's control socket goes in /run/hotproxy.
COPY --chown=10001:10001 run-hotproxy/ /run/hotproxy/
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
# docker stop: SIGTERM to PID 1, which drains every generation within
# server.parent_shutdown_time (45s by default) + 5s. Give it that long:
# `docker run --stop-timeout 60`, or terminationGracePeriodSeconds: 60.
STOPSIGNAL SIGTERM
EXPOSE 8080
# Healthy while a generation serves: server.live is 1 in the shared-memory
# stats only while a generation the kernel holds alive serves (a dead one's
# owner lock is free, and its gauges are dropped, whatever it last wrote),
# read by `hotproxy stats` without asking the proxy (exec form: the
# image has no shell; the admin API stays on loopback). /ready on the admin
# API says the same; to probe it from outside the container, set [admin]
# address = "0.0.0.0:9901" and allow_remote = true, and keep 9901
# unpublished or firewalled.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/usr/local/bin/hotproxy", "stats", "--expect", "server.live=1"]
ENTRYPOINT ["/usr/local/bin/hotproxy", "supervise", "-c", "/etc/hotproxy/hotproxy.toml"]
