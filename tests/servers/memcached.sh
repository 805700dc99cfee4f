#!/usr/bin/env bash
# memcached.sh start DIR [MB] | stop DIR — a private memcached for tests.
#
# Listens on 127.0.0.1 at a free port, TCP only (-U 0), -M (never evict: an
# eviction would silently break a lock, see docs/stores/memcached.md), runs as
# nobody when started as root. Writes DIR/uri = memcached://127.0.0.1:PORT.
# With MB: -m MB and no -M (evicting, as packaged) for the eviction tests.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

cmd=${1:?usage: memcached.sh start|stop DIR}
dir=${2:?usage: memcached.sh start|stop DIR}
need memcached

case $cmd in
start)
	stop_pidfile "$dir/memcached.pid"
	rm -rf "$dir"
	mkdir -p "$dir"
	user=()
	[ "$(id -u)" -eq 0 ] && user=(-u nobody)
	# A free port can be taken by someone else before memcached binds it: retry.
	for attempt in 1 2 3 4 5; do
		port=$(free_port)
		mem=(-M -m 64)
		[ -n "${3:-}" ] && mem=(-m "$3")
		memcached -l 127.0.0.1 -p "$port" -U 0 "${mem[@]}" -t 2 "${user[@]}" \
			>"$dir/memcached.log" 2>&1 &
		pid=$!
		echo "$pid" >"$dir/memcached.pid"
		up=0
		rc=0
		wait_up "$port" "$pid" 10 || rc=$?
		[ $rc = 0 ] && { up=1; break; }
		stop_pidfile "$dir/memcached.pid"
	done
	[ $up = 1 ] || { cat "$dir/memcached.log" >&2; exit 1; }
	echo "memcached://127.0.0.1:$port" >"$dir/uri"
	echo "$port" >"$dir/port"
	;;
stop)
	stop_pidfile "$dir/memcached.pid"
	rm -rf "$dir"
	;;
*)
	echo "usage: memcached.sh start|stop DIR" >&2
	exit 64
	;;
esac
