#!/usr/bin/env bash
# A Redis master, one replica and one Sentinel watching them (quorum 1, the
# master is "down" after 3 s: 1 s let a loaded machine fail over twice), for
# the redis+sentinel:// store:
#   redis-sentinel.sh start DIR   writes DIR/uri = redis+sentinel://127.0.0.1:SP/dlockmaster
#                                 and DIR/master, DIR/replica (their ports)
#   redis-sentinel.sh stop DIR
#   redis-sentinel.sh kill-master DIR   SIGKILL the current master (by port in DIR/master)
source "$(dirname "$0")/lib.sh"

cmd=${1:?usage: redis-sentinel.sh start|stop|kill-master DIR}
dir=${2:?usage: redis-sentinel.sh $cmd DIR}

serving() { # serving PORT PIDFILE: that server, ours, answers
	[ -s "$2" ] && redis-cli -p "$1" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$(cat "$2")"
}

case $cmd in
start)
	need redis-server redis-cli
	rm -rf "$dir"
	mkdir -p "$dir"/m "$dir"/r "$dir"/s
	mp=$(free_port)
	rp=$(free_port)
	sp=$(free_port)
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
	echo "replicaof 127.0.0.1 $mp" >>"$dir/r/redis.conf"
	cat >"$dir/s/sentinel.conf" <<-EOF
		port $sp
		bind 127.0.0.1
		daemonize yes
		pidfile $dir/s/redis.pid
		logfile $dir/s/redis.log
		dir $dir/s
		sentinel monitor dlockmaster 127.0.0.1 $mp 1
		sentinel down-after-milliseconds dlockmaster 3000
		sentinel failover-timeout dlockmaster 4000
	EOF
	redis-server "$dir/m/redis.conf"
	redis-server "$dir/r/redis.conf"
	redis-server "$dir/s/sentinel.conf" --sentinel
	# Sentinel learns of the replica from the master's INFO, which it asks
	# for every 10 s: allow a few rounds of that (seen to take 39 s once).
	for i in $(seq 1 900); do
		if serving "$mp" "$dir/m/redis.pid" && serving "$rp" "$dir/r/redis.pid" &&
			redis-cli -p "$rp" info replication | tr -d '\r' | grep -qx "master_link_status:up" &&
			redis-cli -p "$sp" sentinel replicas dlockmaster 2>/dev/null | grep -q "$rp"; then
			break
		fi
		[ "$i" = 900 ] && { echo "redis master/replica/sentinel did not come up in $dir" >&2; exit 1; }
		sleep 0.1
	done
	echo "$mp" >"$dir/master"
	echo "$rp" >"$dir/replica"
	echo "redis+sentinel://127.0.0.1:$sp/dlockmaster" >"$dir/uri"
	;;
stop)
	for d in m r s; do
		if [ -f "$dir/$d/redis.pid" ]; then stop_pidfile "$dir/$d/redis.pid" & fi
	done
	wait
	;;
kill-master)
	pid=$(cat "$dir/m/redis.pid")
	kill -KILL "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	rm -f "$dir/m/redis.pid"
	;;
*)
	echo "unknown command: $cmd" >&2
	exit 64
	;;
esac
