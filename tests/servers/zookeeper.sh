#!/usr/bin/env bash
# Start/stop Apache ZooKeeper (Debian's zookeeper package, QuorumPeerMain) on
# free loopback ports.
#   zookeeper.sh start DIR [MEMBERS]   MEMBERS servers (default 1; 3 = ensemble)
#   zookeeper.sh stop DIR
#   zookeeper.sh restart-member DIR I  start member I (or mI) again (after a test killed it)
#   zookeeper.sh members DIR  check DIR/members (its order stands: all members fail in turn)
# Writes DIR/uri (zk://every client endpoint) and DIR/members, one line per
# member: "NAME CLIENT_PORT PID_FILE", for tests that kill or pause a member.
#
# tickTime is 100 ms and minSessionTimeout 200 ms so that tests can use short
# session timeouts (a lock's session timeout follows its TTL); the container
# reaper runs every 500 ms so tests can watch empty lock parents disappear.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

cmd=${1:?usage: zookeeper.sh start|stop|restart-member DIR [MEMBERS|I]}
dir=${2:?usage: zookeeper.sh start|stop|restart-member DIR [MEMBERS|I]}

jars=/usr/share/java
classpath="$jars/zookeeper.jar:$jars/slf4j-simple.jar"

stop_all() {
	local f
	for f in "$dir"/m*.pid; do
		[ -e "$f" ] && stop_pidfile "$f"
	done
	# A member whose pid file was lost would keep writing into the data dir
	# the next start makes at the same path (seen once: a member of an earlier
	# run joined the next run's ensemble with its old state).
	pkill -KILL -f "QuorumPeerMain $dir/m[0-9]+\.cfg" 2>/dev/null || true
	rm -rf "$dir"/m*.data
}

# ask PORT WORD: send a four-letter word, print the answer.
ask() {
	timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf %s "$2" >&3 && cat <&3' _ "$1" "$2" 2>/dev/null
}

run_member() {
	local i=$1
	java -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-Dzookeeper.admin.enableServer=false \
		-Dznode.container.checkIntervalMs=500 \
		-Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
		-Dorg.slf4j.simpleLogger.showDateTime=true -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
		-cp "$classpath" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/m$i.cfg" \
		</dev/null >>"$dir/m$i.log" 2>&1 &
	echo $! >"$dir/m$i.pid"
}

# wait_ready SECONDS PORT...: every member serves (srvr shows a Mode); fails
# early when a member process of DIR has exited (e.g. its port was taken).
wait_ready() {
	local secs=$1 p ok f
	shift
	for _ in $(seq 1 $((secs * 10))); do
		ok=1
		for p in "$@"; do
			ask "$p" srvr | grep -q '^Mode: ' || { ok=; break; }
		done
		[ -n "$ok" ] && return 0
		for f in "$dir"/m*.pid; do
			[ -e "$f" ] && ! alive "$(cat "$f")" && return 1
		done
		sleep 0.1
	done
	return 1
}

case $cmd in
start)
	n=${3:-1}
	need java
	[ -r "$jars/zookeeper.jar" ] || { echo "missing $jars/zookeeper.jar (apt-get install zookeeper)" >&2; exit 1; }
	mkdir -p "$dir"
	stop_all
	# Ports are picked free but may be taken before the JVM binds them (other
	# tests run at the same time): start again on new ports, a few times.
	for attempt in 1 2 3 4; do
		rm -f "$dir/uri" "$dir/members"
		declare -a cps pps eps
		used=" "
		for i in $(seq 1 "$n"); do
			for v in cps pps eps; do
				p=$(free_port)
				while [[ $used == *" $p "* ]]; do p=$(free_port); done
				used+="$p "
				eval "$v[$i]=$p"
			done
		done
		clients=
		for i in $(seq 1 "$n"); do
			mkdir -p "$dir/m$i.data"
			{
				echo "tickTime=100"
				echo "initLimit=100"
				echo "syncLimit=50"
				echo "dataDir=$dir/m$i.data"
				echo "clientPort=${cps[$i]}"
				echo "clientPortAddress=127.0.0.1"
				echo "minSessionTimeout=200"
				echo "maxSessionTimeout=600000"
				echo "maxClientCnxns=0"
				echo "4lw.commands.whitelist=ruok,srvr,stat"
				echo "admin.enableServer=false"
				echo "autopurge.purgeInterval=0"
				if [ "$n" -gt 1 ]; then
					echo "$i" >"$dir/m$i.data/myid"
					for j in $(seq 1 "$n"); do
						echo "server.$j=127.0.0.1:${pps[$j]}:${eps[$j]}"
					done
				fi
			} >"$dir/m$i.cfg"
			clients+="${clients:+,}127.0.0.1:${cps[$i]}"
			echo "m$i ${cps[$i]} $dir/m$i.pid" >>"$dir/members"
		done
		for i in $(seq 1 "$n"); do
			: >"$dir/m$i.log"
			run_member "$i"
		done
		if wait_ready 60 "${cps[@]:1}"; then
			break
		fi
		echo "zookeeper in $dir did not become ready (attempt $attempt)" >&2
		tail -n 5 "$dir"/m*.log >&2
		stop_all
		[ "$attempt" = 4 ] && exit 1
	done
	echo "zk://$clients" >"$dir/uri"
	;;
members)
	[ -s "$dir/members" ] || { echo "no members in $dir" >&2; exit 1; }
	;;
restart-member)
	i=${3:?usage: zookeeper.sh restart-member DIR I}
	i=${i#m}
	port=$(awk -v m="m$i" '$1 == m { print $2 }' "$dir/members")
	[ -n "$port" ] || { echo "no member m$i in $dir/members" >&2; exit 1; }
	stop_pidfile "$dir/m$i.pid"
	run_member "$i"
	wait_ready 60 "$port" || { tail -n 20 "$dir/m$i.log" >&2; exit 1; }
	;;
stop)
	stop_all
	;;
*)
	echo "usage: zookeeper.sh start|stop|restart-member DIR [MEMBERS|I]" >&2
	exit 64
	;;
esac
