# telo-runner container image: the runner with the Kubernetes backend selected.
# Needs BuildKit (the default builder of Docker 23+ with buildx; DOCKER_BUILDKIT=1
# on Docker 20.10): it uses cache mounts and skips the stages a build does not use.
#
# From source, with a registry (a Rust build, then a distroless runtime):
#
#   docker build -t telo-runner:0.1.0 .
#   docker build --build-arg TELO_SESSION_IMAGE=telorun/node:<tag>-slim -t telo-runner:0.1.0 .
#
# From a binary built on the host, without a registry (what `scripts/image.sh
# build` does: the build context is a directory holding only `telo-runner`, the
# runtime the local Debian base of `scripts/image.sh bases`):
#
#   docker build -f Dockerfile --build-arg BINARY=prebuilt \
#     --build-arg RUNTIME_IMAGE=telo-runner/debian:bookworm -t telo-runner:dev <dir>

# The images the build starts from; override them to use a mirror.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# Where the binary comes from: `compiled` (built here from the repository) or
# `prebuilt` (`telo-runner` at the root of the build context).
ARG BINARY=compiled

# --- compiled: cargo build -----------------------------------------------------
FROM ${RUST_IMAGE} AS compiled
WORKDIR /src
COPY . .
# The cache mounts keep the registry and incremental artefacts between builds;
# the binary is copied out of the cached target directory before it unmounts.
# The `image` profile is the release build without line tables and symbols
# (Cargo.toml): a sixth of the release binary's size. Backtraces from the image
# name functions by address only; a release build keeps them for debugging.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile image --locked -p telo-runner \
 && install -D -m 0755 target/image/telo-runner /out/telo-runner

# --- prebuilt: the binary from the build context --------------------------------
FROM scratch AS prebuilt
COPY telo-runner /out/telo-runner

FROM ${BINARY} AS binary

# --- runtime -------------------------------------------------------------------
# distroless/cc carries glibc, libgcc and CA certificates and nothing else:
# no shell, no package manager. `nonroot` is uid/gid 65532; we run as 1000 to
# match the chart's pod securityContext.
FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=binary /out/telo-runner /usr/local/bin/telo-runner

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
