#!/usr/bin/env bash
# edge-instructions.sh: the runner's user-space instructions per request
# through the session edge, counted by callgrind (valgrind). Unlike the
# edge benchmark's requests per second, the count does not move with the
# machine's other load, so it tells a change to the edge's per-request work
# apart from the noise of a shared machine.
#
#   scripts/edge-instructions.sh RUNNER FAKE_TELO [REQUESTS [CLIENTS]]
#
# RUNNER is a telo-runner binary. Valgrind 3.19 (Debian 12) cannot read
# the symbols of a binary linked by lld, rustc's default linker, so build
# one with the system linker:
#
#   RUSTFLAGS="-C link-arg=-fuse-ld=bfd" cargo build --release -p telo-runner
#
# It serves a static 100-byte file with Debian's nginx on a free port,
# starts RUNNER under callgrind on the local backend with the edge on
# (RUNNER_PREVIEW_BASE_URL=http://preview.bench, public access), starts a
# session whose body publishes that port, sends 300 requests to warm up,
# then REQUESTS (default 2000) GETs on one keep-alive connection (curl),
# and prints the instructions counted over those requests, per request.
# With CLIENTS (more than 1), the load is instead `wrk` with CLIENTS
# keep-alive connections for 10 seconds (after 3 to warm up), and the
# count is over the requests wrk reports: under callgrind the runner is
# far slower, so what this shows is the work per request when each
# wake-up finds many connections ready, not a rate.
# Everything it starts is stopped when it ends.
set -euo pipefail

usage="usage: edge-instructions.sh RUNNER FAKE_TELO [REQUESTS [CLIENTS]]"
runner=${1:?$usage}
fake_telo=${2:?$usage}
requests=${3:-2000}
clients=${4:-1}
for tool in valgrind callgrind_control nginx curl python3; do
  command -v "$tool" >/dev/null || { echo "edge-instructions.sh: $tool is not on the PATH" >&2; exit 2; }
done

work=$(mktemp -d)
runner_pid=
cleanup() {
  [ -n "$runner_pid" ] && kill "$runner_pid" 2>/dev/null && wait "$runner_pid" 2>/dev/null
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

app_port=$(free_port)
api_port=$(free_port)
mkdir -p "$work/www" "$work/sessions"
# nginx's workers drop to an unprivileged user: they must read the file.
chmod 755 "$work" "$work/www"
head -c 99 /dev/zero | tr '\0' a > "$work/www/small"
echo >> "$work/www/small"
cat > "$work/nginx.conf" <<EOF
worker_processes 1;
daemon on;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events {}
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $work/tmp; proxy_temp_path $work/tmp;
  fastcgi_temp_path $work/tmp; uwsgi_temp_path $work/tmp; scgi_temp_path $work/tmp;
  server { listen 127.0.0.1:$app_port; root $work/www; }
}
EOF
nginx -c "$work/nginx.conf"

env -i PATH="$PATH" HOME="$HOME" PORT="$api_port" LOG_LEVEL=warn \
  RUNNER_BACKEND=local RUNNER_LOCAL_TELO="$fake_telo" RUNNER_LOCAL_WORK_DIR="$work/sessions" \
  RUNNER_LOCAL_NETWORK=host RUNNER_PREVIEW_BASE_URL=http://preview.bench RUNNER_PREVIEW_ACCESS=public \
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.%p" "$runner" serve \
  > "$work/runner.log" 2>&1 &
runner_pid=$!
api="http://127.0.0.1:$api_port"
for _ in $(seq 600); do
  curl -sf "$api/v1/health" >/dev/null && break
  kill -0 "$runner_pid" 2>/dev/null || { cat "$work/runner.log" >&2; exit 1; }
  sleep 0.1
done

bundle='{"bundle":{"entryRelativePath":"telo.yaml","files":[{"relativePath":"telo.yaml","contents":"kind: Telo.Application\nmetadata: { name: edge }\nfakeTelo: {\"stdout\":[\"up\"],\"exitAfterMs\":3600000}\n"}]},"env":{},"ports":[{"port":'"$app_port"',"protocol":"tcp"}],"config":{"image":"telorun/node:0-slim","pullPolicy":"missing"},"inspect":false}'
session=$(curl -sf -X POST "$api/v1/sessions" -H 'content-type: application/json' -d "$bundle" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["sessionId"])')
host="$app_port-$session.preview.bench"
for _ in $(seq 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Host: $host" "$api/small")" = 200 ] && break
  sleep 0.1
done

if [ "$clients" -gt 1 ]; then
  command -v wrk >/dev/null || { echo "edge-instructions.sh: wrk is not on the PATH" >&2; exit 2; }
  wrk -t1 -c"$clients" -d3s -H "Host: $host" "$api/small" >/dev/null
  callgrind_control -z "$runner_pid" >/dev/null 2>&1
  requests=$(wrk -t1 -c"$clients" -d10s -H "Host: $host" "$api/small" | awk '/requests in/ {print $1}')
else
  curl -sf -o /dev/null -H "Host: $host" "$api/small?[1-300]"
  callgrind_control -z "$runner_pid" >/dev/null 2>&1
  curl -sf -o /dev/null -H "Host: $host" "$api/small?[1-$requests]"
fi
callgrind_control -d "$runner_pid" >/dev/null 2>&1
for _ in $(seq 100); do
  compgen -G "$work/callgrind.*.1" >/dev/null && grep -q '^summary:' "$work"/callgrind.*.1 && break
  sleep 0.1
done
dump=$(ls "$work"/callgrind.*.1)
instructions=$(awk '/^summary:/ {print $2; exit}' "$dump")
echo "$requests requests through the edge ($clients client(s)): $((instructions / requests)) instructions per request (runner, user space)"
