#!/usr/bin/env bash
# A 3-member etcd cluster on loopback: etcd.sh with MEMBERS=3
# (dlock_store_suite passes only "start|stop DIR").
exec bash "$(cd "$(dirname "$0")" && pwd)/etcd.sh" "${1:?usage: etcd3.sh start|stop DIR}" "${2:?usage: etcd3.sh start|stop DIR}" 3
