#!/usr/bin/env bash
# A 3-member etcd cluster on loopback: etcd.sh with MEMBERS=3
# (dlock_store_suite passes "start DIR"; the other verbs pass through).
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = start ]; then
	exec bash "$here/etcd.sh" start "${2:?usage: etcd3.sh start|stop|restart-member DIR [NAME]}" 3
fi
exec bash "$here/etcd.sh" "$@"
