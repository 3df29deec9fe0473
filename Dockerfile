# telo-runner container image: the runner with the Kubernetes backend selected.
#
#   docker build -t telo-runner:0.1.0 .
#   docker build --build-arg TELO_SESSION_IMAGE=telorun/node:<tag>-slim -t telo-runner:0.1.0 .

# --- build -------------------------------------------------------------------
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and incremental artefacts between builds;
# the binary is copied out of the cached target directory before it unmounts.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p telo-runner \
 && install -D -m 0755 target/release/telo-runner /out/telo-runner

# --- runtime -----------------------------------------------------------------
# distroless/cc carries glibc, libgcc and CA certificates and nothing else:
# no shell, no package manager. `nonroot` is uid/gid 65532; we run as 1000 to
# match the chart's pod securityContext.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/telo-runner /usr/local/bin/telo-runner

# The kernel image session pods run unless a request or RUNNER_IMAGE says
# otherwise.
ARG TELO_SESSION_IMAGE=telorun/node:latest-slim
ENV RUNNER_IMAGE=${TELO_SESSION_IMAGE} \
    RUNNER_BACKEND=kubernetes \
    PORT=8062 \
    LOG_FORMAT=json

EXPOSE 8062
USER 1000:1000
ENTRYPOINT ["/usr/local/bin/telo-runner"]
CMD ["serve"]
