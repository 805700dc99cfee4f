#!/usr/bin/env bash
# Real redis-server instances on free loopback ports, for the redis and redlock stores.
#
#   redis.sh start DIR [COUNT]   start COUNT servers (default 1) under DIR/<i>/ and write
#                                DIR/uri: redis://127.0.0.1:PORT for one server,
#                                redlock://127.0.0.1:P1,127.0.0.1:P2,... for several,
#                                then also DIR/members: "NAME PORT PID_FILE" per server
#   redis.sh stop DIR            stop every server of DIR
#   redis.sh kill DIR [I]        SIGKILL server I (default 0) — a crash
#   redis.sh restart DIR [I]     start server I again on the same port and data dir
#   redis.sh restart-member DIR mI  the same, by its name in DIR/members
#   redis.sh members DIR  check DIR/members (its order stands: all members fail in turn)
#   redis.sh pause DIR [I]       SIGSTOP server I (hangs, does not refuse)
#   redis.sh resume DIR [I]      SIGCONT server I
#
# REDIS_PERSIST=1 turns on the append-only file with fsync on every write
# (appendfsync always), so a killed and restarted server keeps its data.
# REDIS_TLS=CERTDIR (redis-tls.sh) adds a TLS port (DIR/<i>/tls_port) beside
# the plain one, with CERTDIR's server certificate — expired.pem for server 2
# — and client certificates required by server 1.
source "$(dirname "$0")/lib.sh"

cmd=${1:?usage: redis.sh start|stop|kill|restart|pause|resume DIR [N]}
dir=${2:?usage: redis.sh $cmd DIR [N]}

launch() { # launch I: start server I from its config; 0 when it serves, 2 when its port was taken
	local d=$dir/$1 port
	port=$(cat "$d/port")
	: >"$d/redis.log"
	rm -f "$d/redis.pid"
	redis-server "$d/redis.conf"
	for _ in $(seq 1 300); do
		if grep -q "Address already in use" "$d/redis.log"; then
			return 2
		fi
		# ours, not another program that happens to listen there; serving (AOF loaded)
		if [ -s "$d/redis.pid" ] &&
			redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$(cat "$d/redis.pid")"; then
			return 0
		fi
		sleep 0.1
	done
	echo "redis-server $d did not start on port $port (see $d/redis.log)" >&2
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
		rm -rf "$d" # a fresh server: no data (AOF) left from an earlier run
		mkdir -p "$d"
		aof=no
		[ "${REDIS_PERSIST:-0}" = 1 ] && aof=yes
		for attempt in 1 2 3 4 5; do # a free port can be taken before we bind it
			port=$(free_port)
			echo "$port" >"$d/port"
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
			if [ -n "${REDIS_TLS:-}" ]; then
				tport=$(free_port)
				echo "$tport" >"$d/tls_port"
				crt=server
				[ "$i" -eq 2 ] && crt=expired
				auth=no
				[ "$i" -eq 1 ] && auth=yes
				cat >>"$d/redis.conf" <<-EOF
					tls-port $tport
					tls-cert-file $REDIS_TLS/$crt.pem
					tls-key-file $REDIS_TLS/$crt.key
					tls-ca-cert-file $REDIS_TLS/ca.pem
					tls-auth-clients $auth
				EOF
			fi
			rc=0
			launch "$i" || rc=$?
			[ $rc -eq 0 ] && break
			[ $rc -eq 2 ] && [ $attempt -lt 5 ] && continue
			exit 1
		done
		hosts+=("127.0.0.1:$port")
	done
	if [ "$count" -eq 1 ]; then
		echo "redis://${hosts[0]}" >"$dir/uri"
	else
		(IFS=,; echo "redlock://${hosts[*]}") >"$dir/uri"
		: >"$dir/members"
		for i in $(seq 0 $((count - 1))); do
			echo "m$i ${hosts[$i]##*:} $dir/$i/redis.pid" >>"$dir/members"
		done
	fi
	;;
stop)
	for d in "$dir"/*/; do
		if [ -f "$d/redis.pid" ]; then stop_pidfile "$d/redis.pid" & fi
	done
	wait
	;;
kill)
	d=$dir/${3:-0}
	pid=$(cat "$d/redis.pid")
	kill -KILL "$pid"
	# Until the zombie is reaped, not just dead: this machine's init reaps
	# orphans ~2 s late, and redlock.repair's restarts case depends on that
	# pause. With `alive` here the master is back empty within ~0.1 s and a
	# renewed hold is lost in about 2 of 5 runs (no two holders: the
	# holder is told): an open liveness finding, not yet understood.
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	rm -f "$d/redis.pid"
	;;
restart)
	launch "${3:-0}"
	;;
members)
	[ -s "$dir/members" ] || { echo "no members in $dir" >&2; exit 1; }
	;;
restart-member)
	name=${3:?usage: redis.sh restart-member DIR NAME}
	launch "${name#m}"
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
