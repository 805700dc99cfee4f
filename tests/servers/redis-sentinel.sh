#!/usr/bin/env bash
# A Redis master, one replica and one Sentinel watching them (quorum 1, the
# master is "down" after 3 s: 1 s let a loaded machine fail over twice), for
# the redis+sentinel:// store:
#   redis-sentinel.sh start DIR   writes DIR/uri = redis+sentinel://127.0.0.1:SP/dlockmaster
#                                 and DIR/master, DIR/replica (their ports)
#   redis-sentinel.sh stop DIR
#   redis-sentinel.sh kill-master DIR   SIGKILL the current master (by port in DIR/master)
# REDIS_TLS=1: every server also listens with TLS (a CA of its own in DIR/tls,
# lib.sh make_test_certs), replicates and is watched over TLS, and DIR/uri is
# redis+sentinel://127.0.0.1:SENTINEL_TLS_PORT/dlockmaster?tls=yes&cacert=DIR/tls/ca.pem
# (the plain ports stay, for this script's own checks).
source "$(dirname "$0")/lib.sh"

cmd=${1:?usage: redis-sentinel.sh start|stop|kill-master DIR}
dir=${2:?usage: redis-sentinel.sh $cmd DIR}

serving() { # serving PORT PIDFILE: that server, ours, answers
	[ -s "$2" ] && redis-cli -p "$1" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$(cat "$2")"
}

start_once() { # 0: up; 2: a port was taken; 1: failed
	need redis-server redis-cli
	rm -rf "$dir"
	mkdir -p "$dir"/m "$dir"/r "$dir"/s
	mp=$(free_port)
	rp=$(free_port)
	sp=$(free_port)
	tls=${REDIS_TLS:-}
	# the ports the servers are known by: their TLS ports with REDIS_TLS
	mk=$mp rk=$rp sk=$sp
	if [ -n "$tls" ]; then
		need openssl faketime
		make_test_certs "$dir/tls" || return 1
		mk=$(free_port) rk=$(free_port) sk=$(free_port)
	fi
	tls_conf() { # tls_conf PORT: the TLS lines of a server listening with TLS on PORT
		[ -n "$tls" ] || return 0
		printf '%s\n' "tls-port $1" "tls-cert-file $dir/tls/server.pem" "tls-key-file $dir/tls/server.key" \
			"tls-ca-cert-file $dir/tls/ca.pem" "tls-auth-clients no" "tls-replication yes"
	}
	for role in m r; do
		port=$mp
		[ $role = r ] && port=$rp
		cat >"$dir/$role/redis.conf" <<-EOF
			port $port
			bind 127.0.0.1
			daemonize yes
			pidfile $dir/$role/redis.pid
			logfile $dir/$role/redis.log
			dir $dir/$role
			save ""
			appendonly no
		EOF
	done
	tls_conf "$mk" >>"$dir/m/redis.conf"
	tls_conf "$rk" >>"$dir/r/redis.conf"
	echo "replicaof 127.0.0.1 $mk" >>"$dir/r/redis.conf"
	cat >"$dir/s/sentinel.conf" <<-EOF
		port $sp
		bind 127.0.0.1
		daemonize yes
		pidfile $dir/s/redis.pid
		logfile $dir/s/redis.log
		dir $dir/s
		sentinel monitor dlockmaster 127.0.0.1 $mk 1
		sentinel down-after-milliseconds dlockmaster 3000
		sentinel failover-timeout dlockmaster 4000
	EOF
	tls_conf "$sk" >>"$dir/s/sentinel.conf"
	redis-server "$dir/m/redis.conf"
	redis-server "$dir/r/redis.conf"
	redis-server "$dir/s/sentinel.conf" --sentinel
	# Sentinel learns of the replica from the master's INFO, which it asks
	# for every 10 s: allow a few rounds of that (seen to take 39 s once).
	for i in $(seq 1 900); do
		if serving "$mp" "$dir/m/redis.pid" && serving "$rp" "$dir/r/redis.pid" &&
			redis-cli -p "$rp" info replication | tr -d '\r' | grep -qx "master_link_status:up" &&
			redis-cli -p "$sp" sentinel replicas dlockmaster 2>/dev/null | grep -qx "$rk"; then
			break
		fi
		# a port taken between free_port and the bind (by another fixture's
		# server or cluster bus): the caller tries again with other ports
		grep -qs "Address already in use" "$dir"/m/redis.log "$dir"/r/redis.log "$dir"/s/redis.log && return 2
		[ "$i" = 900 ] && { echo "redis master/replica/sentinel did not come up in $dir" >&2; return 1; }
		sleep 0.1
	done
	echo "$mp" >"$dir/master"
	echo "$rp" >"$dir/replica"
	if [ -n "$tls" ]; then
		echo "redis+sentinel://127.0.0.1:$sk/dlockmaster?tls=yes&cacert=$dir/tls/ca.pem" >"$dir/uri"
	else
		echo "redis+sentinel://127.0.0.1:$sp/dlockmaster" >"$dir/uri"
	fi
}

stop_all() {
	for d in m r s; do
		if [ -f "$dir/$d/redis.pid" ]; then stop_pidfile "$dir/$d/redis.pid" & fi
	done
	wait
}

case $cmd in
start)
	for attempt in 1 2 3 4 5; do
		rc=0
		start_once || rc=$?
		[ $rc -eq 0 ] && break
		stop_all
		[ $rc -eq 2 ] && [ $attempt -lt 5 ] && continue
		echo "redis master/replica/sentinel did not come up in $dir (see $dir/*/redis.log)" >&2
		exit 1
	done
	;;
stop)
	stop_all
	;;
kill-master)
	pid=$(cat "$dir/m/redis.pid")
	kill -KILL "$pid"
	while alive "$pid"; do sleep 0.05; done
	rm -f "$dir/m/redis.pid"
	;;
*)
	echo "unknown command: $cmd" >&2
	exit 64
	;;
esac
