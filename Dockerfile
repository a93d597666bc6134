# Multi-stage build of the I-TCP appliance into a slim runtime image: msrd and itcpctl
# for routers, itcp-mh-agent for mobile hosts, plus the testbed tools (itcp-lab,
# airlink, ttcp). Handoff logs go to /var/log/itcp (mount it to keep them).
#
#   docker build -t itcp .
#   docker run -d --name msrd --network host --cap-add NET_ADMIN --cap-add NET_RAW \
#       --cap-add SYS_RESOURCE -v /etc/msrd:/etc/msrd:ro itcp
#   docker exec msrd itcpctl sessions
#
# msrd needs the host's network namespace (--network host: it serves the router's cell
# and fixed interfaces) and CAP_NET_ADMIN for transparent sockets, its nftables table
# and policy route; CAP_SYS_RESOURCE lets it raise its fd limit. The testbed instead
# needs --privileged (it creates namespaces and TAP devices):
#   docker run --rm --privileged itcp itcp-lab demo

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --workspace --bins

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 nftables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/msrd /src/target/release/itcpctl \
     /src/target/release/itcp-mh-agent \
     /src/target/release/itcp-lab /src/target/release/airlink /src/target/release/ttcp /usr/local/bin/
COPY config/examples/ /usr/share/doc/itcp/examples/
ENTRYPOINT []
CMD ["msrd", "--config", "/etc/msrd/msrd.toml"]
