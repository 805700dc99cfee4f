#!/usr/bin/env bash
# dlock's ZooKeeper store next to Apache Curator's InterProcessMutex and
# python3-kazoo's Lock on one fresh standalone server, in one run: the
# zookeeper part of bench/run-all (which see), printed instead of written
# to docs/performance.md.
#   bench/zookeeper_peers.sh [SECONDS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d /tmp/dlock-zk-peers-XXXXXX)
trap 'rm -rf "$out"' EXIT
"$here/run-all" --stores zookeeper --seconds "${1:-5}" --out "$out"
sed -n '/^## zookeeper/,$p' "$out/performance.md"
