# Multi-stage build of the I-TCP appliance's binaries into a slim runtime image.
# Today the image carries the testbed tools (itcp-lab, airlink, ttcp); msrd and itcpctl
# join it when the relay issue lands.
#
#   docker build -t itcp .
#   docker run --rm --privileged itcp itcp-lab demo
#
# The lab needs --privileged: it creates network namespaces and TAP devices
# (CAP_SYS_ADMIN, CAP_NET_ADMIN, /dev/net/tun).

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --workspace --bins

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 nftables iptables kmod \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/itcp-lab /src/target/release/airlink /src/target/release/ttcp /usr/local/bin/
CMD ["itcp-lab", "--help"]
