#!/usr/bin/env bash
# A 3-server ZooKeeper ensemble on loopback: zookeeper.sh with MEMBERS=3
# (dlock_store_suite passes "start DIR"; the other verbs pass through).
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = start ]; then
	exec bash "$here/zookeeper.sh" start "${2:?usage: zookeeper3.sh start|stop|restart-member DIR [NAME]}" 3
fi
exec bash "$here/zookeeper.sh" "$@"
