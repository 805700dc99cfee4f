#!/usr/bin/env bash
# Real redis-server instances on free loopback ports, for the redis and redlock stores.
#
#   redis.sh start DIR [COUNT]   start COUNT servers (default 1) under DIR/<i>/ and write
#                                DIR/uri: redis://127.0.0.1:PORT for one server,
#                                redlock://127.0.0.1:P1,127.0.0.1:P2,... for several
#   redis.sh stop DIR            stop every server of DIR
#   redis.sh kill DIR [I]        SIGKILL server I (default 0) — a crash
#   redis.sh restart DIR [I]     start server I again on the same port and data dir
#   redis.sh pause DIR [I]       SIGSTOP server I (hangs, does not refuse)
#   redis.sh resume DIR [I]      SIGCONT server I
#
# REDIS_PERSIST=1 turns on the append-only file with fsync on every write
# (appendfsync always), so a killed and restarted server keeps its data.
source "$(dirname "$0")/lib.sh"

cmd=${1:?usage: redis.sh start|stop|kill|restart|pause|resume DIR [N]}
dir=${2:?usage: redis.sh $cmd DIR [N]}

launch() { # launch I: start server I from its config, wait until it answers
	local d=$dir/$1 port
	port=$(cat "$d/port")
	redis-server "$d/redis.conf"
	wait_port "$port" 30
	for _ in $(seq 1 100); do # accepting is not yet serving (AOF loading)
		if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
			return 0
		fi
		sleep 0.1
	done
	echo "redis-server on port $port does not answer PING" >&2
	return 1
}

case $cmd in
start)
	need redis-server redis-cli
	count=${3:-1}
	mkdir -p "$dir"
	hosts=()
	for i in $(seq 0 $((count - 1))); do
		d=$dir/$i
		mkdir -p "$d"
		port=$(free_port)
		echo "$port" >"$d/port"
		aof=no
		[ "${REDIS_PERSIST:-0}" = 1 ] && aof=yes
		cat >"$d/redis.conf" <<-EOF
			port $port
			bind 127.0.0.1
			protected-mode yes
			daemonize yes
			pidfile $d/redis.pid
			logfile $d/redis.log
			dir $d
			save ""
			appendonly $aof
			appendfsync always
		EOF
		launch "$i"
		hosts+=("127.0.0.1:$port")
	done
	if [ "$count" -eq 1 ]; then
		echo "redis://${hosts[0]}" >"$dir/uri"
	else
		(IFS=,; echo "redlock://${hosts[*]}") >"$dir/uri"
	fi
	;;
stop)
	for d in "$dir"/*/; do
		[ -f "$d/redis.pid" ] && stop_pidfile "$d/redis.pid"
	done
	;;
kill)
	d=$dir/${3:-0}
	pid=$(cat "$d/redis.pid")
	kill -KILL "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	rm -f "$d/redis.pid"
	;;
restart)
	launch "${3:-0}"
	;;
pause)
	kill -STOP "$(cat "$dir/${3:-0}/redis.pid")"
	;;
resume)
	kill -CONT "$(cat "$dir/${3:-0}/redis.pid")"
	;;
*)
	echo "unknown command: $cmd" >&2
	exit 64
	;;
esac
