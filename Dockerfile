# ksched and the example worker in one image (used by deploy/docker-compose.ksched.yml and
# deploy/k8s/). Build: docker build -t ksched:dev .
FROM rust:1.88-bookworm AS build
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      libclang-dev cmake libcurl4-openssl-dev pkg-config g++ >/dev/null
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p ksched -p ksched-worker --example echo_worker \
 && mkdir -p /out && cp target/release/ksched target/release/examples/echo_worker /out/

FROM debian:bookworm-slim
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      ca-certificates libcurl4 >/dev/null && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home /var/lib/ksched ksched \
 && mkdir -p /var/lib/ksched/data /etc/ksched && chown -R ksched /var/lib/ksched
COPY --from=build /out/ksched /out/echo_worker /usr/local/bin/
COPY config/ /etc/ksched/
USER ksched
WORKDIR /var/lib/ksched
ENV KSCHED_CONFIG=/etc/ksched/ksched.yaml \
    KSCHED__STORAGE__DATA_DIR=/var/lib/ksched/data
EXPOSE 8080
ENTRYPOINT ["ksched"]
CMD ["run"]
