#!/usr/bin/env bash
# engine.sh: a usable container engine (Docker) for building and running the
# images of scripts/image.sh. Installs nothing (.ci/run installs docker.io).
#
#   scripts/engine.sh start    use the daemon that answers, else start dockerd
#                              in the background and wait until it answers
#   scripts/engine.sh stop     stop the dockerd `start` started (nothing else)
#   scripts/engine.sh status   exit 0 when a daemon answers
#
# Environment:
#   TELO_RUNNER_CONTAINER_ENGINE  the docker client to use (default: see
#                                 engine_client below)
#   TELO_RUNNER_ENGINE_DIR        state dir of a dockerd started here: its
#                                 pidfile and log (default
#                                 ~/.cache/telo-runner-engine)
#   TELO_RUNNER_DOCKERD_FLAGS     extra dockerd flags, e.g.
#                                 "--storage-driver=vfs"
#   TELO_RUNNER_ENGINE_TIMEOUT    seconds to wait for dockerd (default 60)
#
# Sourced (`. scripts/engine.sh`), it only defines the functions.

ENGINE_DIR=${TELO_RUNNER_ENGINE_DIR:-$HOME/.cache/telo-runner-engine}
ENGINE_PIDFILE=$ENGINE_DIR/dockerd.pid
ENGINE_LOG=$ENGINE_DIR/dockerd.log
ENGINE_SCRIPT=${BASH_SOURCE[0]}

engine_log() { printf '[engine] %s\n' "$*" >&2; }

# The docker client whose builds use BuildKit, which the Dockerfile needs
# (`RUN --mount=type=cache`, stages a target does not use are skipped). A
# client older than Docker 23 (Debian's docker.io is 20.10) has BuildKit
# built in (DOCKER_BUILDKIT=1); a newer one only through the buildx plugin
# and otherwise falls back to the legacy builder. So: the first `docker` on
# PATH that has buildx or is older than 23, then /usr/bin/docker (the client
# Debian ships beside its dockerd).
engine_client() {
  if [ -n "${TELO_RUNNER_CONTAINER_ENGINE:-}" ]; then
    command -v "$TELO_RUNNER_CONTAINER_ENGINE" || {
      engine_log "TELO_RUNNER_CONTAINER_ENGINE=$TELO_RUNNER_CONTAINER_ENGINE is not an executable"
      return 1
    }
    return 0
  fi
  local c major seen=
  for c in $(type -ap docker) /usr/bin/docker; do
    [ -x "$c" ] || continue
    case " $seen " in *" $c "*) continue ;; esac
    seen="$seen $c"
    major=$("$c" --version 2>/dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')
    [ -n "$major" ] || continue
    if [ "$major" -lt 23 ] || "$c" buildx version >/dev/null 2>&1; then
      echo "$c"
      return 0
    fi
  done
  engine_log "no docker client that builds with BuildKit (tried:${seen:- none});" \
    "install docker.io, or the buildx plugin for a Docker 23+ client"
  return 1
}

engine_answers() { "$1" info >/dev/null 2>&1; }

# The pid of the dockerd `start` started, when it still runs.
engine_own_pid() {
  local pid
  pid=$(cat "$ENGINE_PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "dockerd .*--pidfile $ENGINE_PIDFILE" || return 1
  echo "$pid"
}

engine_start() {
  local client
  client=$(engine_client) || return 1
  if engine_answers "$client"; then
    engine_log "using the running daemon ($("$client" info --format '{{.ServerVersion}}, storage {{.Driver}}' 2>/dev/null))"
    return 0
  fi
  command -v dockerd >/dev/null 2>&1 || {
    engine_log "no daemon answers and dockerd is not installed (apt-get install docker.io)"
    return 1
  }
  [ "$(id -u)" = 0 ] || { engine_log "starting dockerd needs root"; return 1; }
  mkdir -p "$ENGINE_DIR"
  if engine_own_pid >/dev/null; then
    engine_log "dockerd $(engine_own_pid) (started earlier) does not answer; see $ENGINE_LOG"
    return 1
  fi
  rm -f "$ENGINE_PIDFILE"
  # One log per start; the previous one is kept as dockerd.log.1.
  [ ! -e "$ENGINE_LOG" ] || mv -f "$ENGINE_LOG" "$ENGINE_LOG.1"
  # --iptables=false: the machine may lack iptables/nf_tables rights, and
  # nothing here needs NAT (tests use the host network or the bridge's own
  # addresses). The storage driver is dockerd's choice (overlay2 where the
  # filesystem supports it, else vfs); TELO_RUNNER_DOCKERD_FLAGS overrides.
  local t0=$SECONDS timeout=${TELO_RUNNER_ENGINE_TIMEOUT:-60} pid
  # shellcheck disable=SC2086
  setsid dockerd --iptables=false --pidfile "$ENGINE_PIDFILE" ${TELO_RUNNER_DOCKERD_FLAGS:-} \
    </dev/null >>"$ENGINE_LOG" 2>&1 &
  pid=$!
  engine_log "started dockerd (pid $pid, log $ENGINE_LOG); waiting for it to answer"
  until engine_answers "$client"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      engine_log "dockerd exited before answering; the end of $ENGINE_LOG:"
      tail -n 15 "$ENGINE_LOG" >&2
      return 1
    fi
    if [ $((SECONDS - t0)) -ge "$timeout" ]; then
      engine_log "dockerd did not answer within ${timeout}s; see $ENGINE_LOG"
      kill "$pid" 2>/dev/null
      return 1
    fi
    sleep 0.1
  done
  engine_log "dockerd answers after $((SECONDS - t0))s ($("$client" info --format '{{.ServerVersion}}, storage {{.Driver}}'));" \
    "stop it with: $ENGINE_SCRIPT stop"
}

engine_stop() {
  local pid
  if ! pid=$(engine_own_pid); then
    engine_log "no dockerd started by this script is running; nothing stopped"
    return 0
  fi
  kill -TERM "$pid"
  # dockerd stops its containers (up to their stop timeout) and its
  # containerd before it exits.
  for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    engine_log "dockerd $pid still runs 60s after SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$ENGINE_PIDFILE"
  engine_log "stopped dockerd $pid"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    start) engine_start ;;
    stop) engine_stop ;;
    status)
      client=$(engine_client)
      if engine_answers "$client"; then
        echo "running: $client -> $("$client" info --format '{{.ServerVersion}}, storage {{.Driver}}')"
        if pid=$(engine_own_pid); then echo "dockerd $pid was started by $ENGINE_SCRIPT (log $ENGINE_LOG)"; fi
      else
        echo "no daemon answers ($client)"
        exit 1
      fi
      ;;
    *)
      echo "usage: $0 start|stop|status" >&2
      exit 2
      ;;
  esac
fi
