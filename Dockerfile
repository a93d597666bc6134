# Multi-stage build of the I-TCP appliance into a slim runtime image, from the same
# Debian package as bare-metal installs (scripts/deb): msrd and itcpctl for routers,
# itcp-mh-agent for mobile hosts, configs in /etc/itcp, man pages; plus the testbed
# tools (itcp-lab, airlink, ttcp). Handoff logs go to /var/log/itcp (mount it to keep
# them).
#
#   docker build -t itcp .
#   docker run -d --name msrd --network host --cap-add NET_ADMIN --cap-add NET_RAW \
#       --cap-add SYS_RESOURCE -v /etc/itcp:/etc/itcp:ro itcp
#   docker exec msrd itcpctl sessions
#
# msrd needs the host's network namespace (--network host: it serves the router's cell
# and fixed interfaces) and CAP_NET_ADMIN for transparent sockets, its nftables table
# and policy route; CAP_SYS_RESOURCE lets it raise its fd limit. The testbed instead
# needs --privileged (it creates namespaces and TAP devices):
#   docker run --rm --privileged itcp itcp-lab demo

FROM rust:1-slim-bookworm AS build
# dpkg-dev: dpkg-shlibdeps and dpkg-architecture for scripts/deb; binutils: strip.
RUN apt-get update \
 && apt-get install -y --no-install-recommends dpkg-dev binutils \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Builds the workspace (binaries and the C library) and target/deb/itcp_*.deb.
RUN scripts/deb

FROM debian:bookworm-slim
COPY --from=build /src/target/deb/ /tmp/deb/
# apt installs the package's dependencies (iproute2, nftables) with it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/deb/itcp_*.deb \
 && rm -rf /var/lib/apt/lists/* /tmp/deb
COPY --from=build /src/target/release/itcp-lab /src/target/release/airlink \
     /src/target/release/ttcp /usr/local/bin/
ENTRYPOINT []
CMD ["msrd", "--config", "/etc/itcp/msrd.toml"]
