#!/usr/bin/env bash
# Start/stop etcd (Debian etcd-server 3.4) on free loopback ports.
#   etcd.sh start DIR [MEMBERS]   MEMBERS members (default 1) as one cluster
#   etcd.sh stop DIR
# Writes DIR/uri (etcd://every client endpoint) and DIR/members, one line per
# member: "NAME CLIENT_PORT PID_FILE", for tests that kill or pause a member.
# DLOCK_ETCD_ARGS: extra etcd flags for every member (e.g. --auth-token-ttl=1).
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

cmd=${1:?usage: etcd.sh start|stop DIR [MEMBERS]}
dir=${2:?usage: etcd.sh start|stop DIR [MEMBERS]}

stop_all() {
	local f
	for f in "$dir"/m*.pid; do
		[ -e "$f" ] && stop_pidfile "$f"
	done
	rm -rf "$dir"/m*.data
}

case $cmd in
start)
	n=${3:-1}
	need etcd etcdctl
	mkdir -p "$dir"
	stop_all
	rm -f "$dir/uri" "$dir/members"
	cluster= clients= eps=
	declare -a cps pps
	for i in $(seq 1 "$n"); do
		cps[$i]=$(free_port)
		pps[$i]=$(free_port)
		while [ "${pps[$i]}" = "${cps[$i]}" ]; do pps[$i]=$(free_port); done
		cluster+="${cluster:+,}m$i=http://127.0.0.1:${pps[$i]}"
		clients+="${clients:+,}127.0.0.1:${cps[$i]}"
		eps+="${eps:+,}http://127.0.0.1:${cps[$i]}"
	done
	for i in $(seq 1 "$n"); do
		etcd --name "m$i" --data-dir "$dir/m$i.data" \
			--listen-client-urls "http://127.0.0.1:${cps[$i]}" \
			--advertise-client-urls "http://127.0.0.1:${cps[$i]}" \
			--listen-peer-urls "http://127.0.0.1:${pps[$i]}" \
			--initial-advertise-peer-urls "http://127.0.0.1:${pps[$i]}" \
			--initial-cluster "$cluster" --initial-cluster-state new \
			--initial-cluster-token "dlock-test-$$" ${DLOCK_ETCD_ARGS:-} \
			</dev/null >"$dir/m$i.log" 2>&1 &
		echo $! >"$dir/m$i.pid"
		echo "m$i ${cps[$i]} $dir/m$i.pid" >>"$dir/members"
	done
	for i in $(seq 1 "$n"); do
		wait_port "${cps[$i]}" 60 || { tail -20 "$dir/m$i.log" >&2; stop_all; exit 1; }
	done
	ok=
	for _ in $(seq 1 300); do
		if ETCDCTL_API=3 etcdctl --endpoints="$eps" --dial-timeout=1s --command-timeout=2s \
			endpoint health >/dev/null 2>&1; then
			ok=1
			break
		fi
		sleep 0.1
	done
	if [ -z "$ok" ]; then
		echo "etcd cluster in $dir did not become healthy" >&2
		tail -20 "$dir"/m*.log >&2
		stop_all
		exit 1
	fi
	echo "etcd://$clients" >"$dir/uri"
	;;
stop)
	stop_all
	;;
*)
	echo "usage: etcd.sh start|stop DIR [MEMBERS]" >&2
	exit 64
	;;
esac
