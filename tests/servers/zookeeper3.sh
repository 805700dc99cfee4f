#!/usr/bin/env bash
# A 3-server ZooKeeper ensemble on loopback: zookeeper.sh with MEMBERS=3
# (dlock_store_suite passes only "start|stop DIR").
exec bash "$(cd "$(dirname "$0")" && pwd)/zookeeper.sh" "${1:?usage: zookeeper3.sh start|stop DIR}" "${2:?usage: zookeeper3.sh start|stop DIR}" 3
