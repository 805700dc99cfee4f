#!/usr/bin/env bash
# A real Redis Cluster: 3 masters and 3 replicas (redis-cli --cluster create
# --cluster-replicas 1) on free loopback ports, node timeout 1 s (a killed
# master's replica takes over within a few seconds), for redis+cluster://:
#   redis-cluster.sh start DIR      writes DIR/uri = redis+cluster://h:p1,...,h:p6
#                                   (every node: the fault proxy fronts each one)
#                                   and DIR/<i>/port for node i = 0..5;
#                                   DIR/members: "NAME PORT PID_FILE" per node
#   redis-cluster.sh stop DIR
#   redis-cluster.sh kill DIR PORT  SIGKILL the node on PORT (a crash)
#   redis-cluster.sh restart DIR PORT  start that node again (it rejoins as a
#                                   replica of the master that replaced it)
#   redis-cluster.sh restart-member DIR nI  the same for node I (its name in DIR/members)
#   redis-cluster.sh wait-ok DIR    wait until every node says cluster_state:ok
#   redis-cluster.sh members DIR    rewrite DIR/members with the nodes that are
#                                   masters now first (failovers move the role:
#                                   the chaos cases fail the first three)
# REDIS_TLS=1: every node also listens with TLS (a CA of its own in DIR/tls,
# lib.sh make_test_certs), the cluster bus and replication go over TLS, and
# DIR/uri is rediss+cluster://127.0.0.1:TLS_PORT,...?cacert=DIR/tls/ca.pem
# (DIR/<i>/port stays the plain port, for this script's and the tests' checks).
source "$(dirname "$0")/lib.sh"

cmd=${1:?usage: redis-cluster.sh start|stop|kill|wait-ok DIR [PORT]}
dir=${2:?usage: redis-cluster.sh $cmd DIR}

state_ok() { # state_ok PORT: that node sees the cluster whole
	redis-cli -p "$1" cluster info 2>/dev/null | tr -d '\r' | grep -qx "cluster_state:ok"
}

wait_ok() {
	local p i ok
	for i in $(seq 1 600); do
		ok=1
		for p in $(cat "$dir"/[0-9]/port); do
			[ -f "$dir/dead-$p" ] && continue
			state_ok "$p" || { ok=0; break; }
		done
		[ $ok = 1 ] && return 0
		sleep 0.1
	done
	echo "redis cluster in $dir did not reach cluster_state:ok" >&2
	return 1
}

# list_members: DIR/members, "nI PORT PID_FILE" per node, masters first.
list_members() {
	local i port role masters=() replicas=()
	for i in 0 1 2 3 4 5; do
		port=$(cat "$dir/$i/port")
		role=$(redis-cli -p "$port" role 2>/dev/null | head -n 1 | tr -d '\r')
		if [ "$role" = master ]; then
			masters+=("n$i $port $dir/$i/redis.pid")
		else
			replicas+=("n$i $port $dir/$i/redis.pid")
		fi
	done
	printf '%s\n' "${masters[@]}" "${replicas[@]}" >"$dir/members.new"
	mv "$dir/members.new" "$dir/members"
}

case $cmd in
start)
	need redis-server redis-cli
	rm -rf "$dir"
	mkdir -p "$dir"
	tls=${REDIS_TLS:-}
	if [ -n "$tls" ]; then
		need openssl faketime
		make_test_certs "$dir/tls" || exit 1
	fi
	hosts=() thosts=()
	for i in 0 1 2 3 4 5; do
		d=$dir/$i
		mkdir -p "$d"
		for attempt in 1 2 3 4 5 6 7 8; do # a free port can be taken before we bind it
			# the cluster bus listens on port + 10000: both must be free
			for _ in $(seq 1 50); do
				port=$(free_port)
				[ "$port" -lt 55000 ] && ! (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null && break
			done
			echo "$port" >"$d/port"
			cat >"$d/redis.conf" <<-EOF
				port $port
				bind 127.0.0.1
				daemonize yes
				pidfile $d/redis.pid
				logfile $d/redis.log
				dir $d
				save ""
				appendonly no
				cluster-enabled yes
				cluster-config-file $d/nodes.conf
				cluster-node-timeout 1000
				cluster-replica-validity-factor 0
			EOF
			if [ -n "$tls" ]; then
				tport=$(free_port)
				echo "$tport" >"$d/tls_port"
				printf '%s\n' "tls-port $tport" "tls-cert-file $dir/tls/server.pem" \
					"tls-key-file $dir/tls/server.key" "tls-ca-cert-file $dir/tls/ca.pem" \
					"tls-auth-clients no" "tls-cluster yes" "tls-replication yes" >>"$d/redis.conf"
			fi
			: >"$d/redis.log"
			rm -f "$d/nodes.conf"
			redis-server "$d/redis.conf"
			up=0
			for _ in $(seq 1 300); do
				grep -q "Address already in use" "$d/redis.log" && break
				if [ -s "$d/redis.pid" ] && redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' |
					grep -qx "process_id:$(cat "$d/redis.pid")"; then
					up=1
					break
				fi
				sleep 0.1
			done
			[ $up = 1 ] && break
			[ -f "$d/redis.pid" ] && stop_pidfile "$d/redis.pid"
			[ $attempt = 8 ] && { echo "redis-server $d did not start (see $d/redis.log)" >&2; exit 1; }
		done
		hosts+=("127.0.0.1:$port")
		[ -n "$tls" ] && thosts+=("127.0.0.1:$(cat "$d/tls_port")")
	done
	redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
		{ cat "$dir/create.log" >&2; exit 1; }
	wait_ok
	# every replica replicating before anyone locks (WAIT 1 needs one)
	for i in $(seq 1 300); do
		n=$(for p in $(cat "$dir"/[0-9]/port); do redis-cli -p "$p" info replication | tr -d '\r'; done |
			grep -c "^master_link_status:up" || true)
		[ "$n" -ge 3 ] && break
		[ "$i" = 300 ] && { echo "redis cluster replicas did not sync in $dir" >&2; exit 1; }
		sleep 0.1
	done
	if [ -n "$tls" ]; then
		(IFS=,; echo "rediss+cluster://${thosts[*]}?cacert=$dir/tls/ca.pem") >"$dir/uri"
	else
		(IFS=,; echo "redis+cluster://${hosts[*]}") >"$dir/uri"
	fi
	list_members
	;;
members)
	list_members
	;;
stop)
	for d in "$dir"/[0-9]/; do
		if [ -f "$d/redis.pid" ]; then stop_pidfile "$d/redis.pid" & fi
	done
	wait
	;;
kill)
	port=${3:?usage: redis-cluster.sh kill DIR PORT}
	for d in "$dir"/[0-9]/; do
		[ "$(cat "$d/port")" = "$port" ] || continue
		pid=$(cat "$d/redis.pid")
		kill -KILL "$pid"
		while alive "$pid"; do sleep 0.05; done
		rm -f "$d/redis.pid"
		touch "$dir/dead-$port"
	done
	;;
restart | restart-member)
	if [ "$cmd" = restart ]; then
		port=${3:?usage: redis-cluster.sh restart DIR PORT}
	else
		name=${3:?usage: redis-cluster.sh restart-member DIR NAME}
		port=$(cat "$dir/${name#n}/port") || exit 1
	fi
	for d in "$dir"/[0-9]/; do
		[ "$(cat "$d/port")" = "$port" ] || continue
		redis-server "$d/redis.conf"
		wait_up "$port" "" 30
		rm -f "$dir/dead-$port"
		for i in $(seq 1 300); do
			redis-cli -p "$port" info replication | tr -d '\r' | grep -qx "master_link_status:up" && break
			[ "$i" = 300 ] && { echo "node $port did not rejoin as a replica" >&2; exit 1; }
			sleep 0.1
		done
	done
	wait_ok
	;;
wait-ok)
	wait_ok
	;;
*)
	echo "unknown command: $cmd" >&2
	exit 64
	;;
esac
