#!/usr/bin/env bash
# Start/stop etcd (Debian etcd-server 3.4) on free loopback ports.
#   etcd.sh start DIR [MEMBERS]   MEMBERS members (default 1) as one cluster
#   etcd.sh stop DIR
#   etcd.sh restart-member DIR NAME   start member NAME again (after a test killed it)
#   etcd.sh members DIR  check DIR/members (its order stands: all members fail in turn)
# Writes DIR/uri (etcd://every client endpoint) and DIR/members, one line per
# member: "NAME CLIENT_PORT PID_FILE", for tests that kill or pause a member.
# DLOCK_ETCD_ARGS: extra etcd flags for every member (e.g. --auth-token-ttl=1).
# DLOCK_ETCD_TLS=1: clients speak TLS with client certificates (a CA, server
# and client certificates made with openssl in DIR); the URI is then
# etcds://...?cacert=...&cert=...&key=...
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

cmd=${1:?usage: etcd.sh start|stop|restart-member DIR [MEMBERS|NAME]}
dir=${2:?usage: etcd.sh start|stop|restart-member DIR [MEMBERS|NAME]}

stop_all() {
	local f
	for f in "$dir"/m*.pid; do
		[ -e "$f" ] && stop_pidfile "$f"
	done
	rm -rf "$dir"/m*.data
}

# run_member NAME: start member NAME with the flags it was first started
# with (DIR/NAME.args); its data dir makes a restarted member rejoin.
run_member() {
	local args
	mapfile -d '' args <"$dir/$1.args"
	etcd "${args[@]}" </dev/null >>"$dir/$1.log" 2>&1 &
	echo $! >"$dir/$1.pid"
}

# wait_healthy ENDPOINTS NAME...: wait (up to 60 s) until etcdctl finds the
# endpoints healthy (a member back in its cluster, with a leader): 0; 2 as
# soon as one of the named members has exited (its name in $dead); 1 at 60 s.
# Uses $ctlflags (TLS client flags, or none).
wait_healthy() {
	local eps=$1 m
	shift
	dead=
	for _ in $(seq 1 600); do
		ETCDCTL_API=3 etcdctl --endpoints="$eps" --dial-timeout=1s --command-timeout=2s \
			"${ctlflags[@]}" endpoint health >/dev/null 2>&1 && return 0
		for m in "$@"; do
			alive "$(cat "$dir/$m.pid")" || dead=$m
		done
		[ -z "$dead" ] || return 2
		sleep 0.1
	done
	return 1
}

case $cmd in
start)
	n=${3:-1}
	need etcd etcdctl
	mkdir -p "$dir"
	stop_all
	rm -f "$dir/uri" "$dir/members"
	scheme=http tlsflags=() ctlflags=()
	if [ -n "${DLOCK_ETCD_TLS:-}" ]; then
		need openssl
		scheme=https
		(
			cd "$dir"
			openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=dlock-test-ca \
				-keyout ca-key.pem -out ca.pem
			for who in server client; do
				openssl req -newkey rsa:2048 -nodes -subj "/CN=dlock-test-$who" \
					-keyout "$who-key.pem" -out "$who.csr"
				printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >"$who.ext"
				openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
					-days 2 -extfile "$who.ext" -out "$who.pem"
			done
		) >"$dir/openssl.log" 2>&1 || { cat "$dir/openssl.log" >&2; exit 1; }
		tlsflags=(--cert-file "$dir/server.pem" --key-file "$dir/server-key.pem"
			--trusted-ca-file "$dir/ca.pem" --client-cert-auth)
		ctlflags=(--cacert "$dir/ca.pem" --cert "$dir/client.pem" --key "$dir/client-key.pem")
	fi
	# A free port can be taken before etcd binds it (another server, or an
	# outgoing connection's ephemeral port): then start over on new ports.
	started=
	for try in 1 2 3; do
		stop_all
		rm -f "$dir/members"
		cluster= clients= eps= used=" "
		declare -a cps pps
		for i in $(seq 1 "$n"); do
			for which in c p; do
				p=$(free_port)
				while [[ $used == *" $p "* ]]; do p=$(free_port); done
				used+="$p "
				if [ $which = c ]; then cps[$i]=$p; else pps[$i]=$p; fi
			done
			cluster+="${cluster:+,}m$i=http://127.0.0.1:${pps[$i]}"
			clients+="${clients:+,}127.0.0.1:${cps[$i]}"
			eps+="${eps:+,}$scheme://127.0.0.1:${cps[$i]}"
		done
		for i in $(seq 1 "$n"); do
			# shellcheck disable=SC2086 # DLOCK_ETCD_ARGS: several flags
			printf '%s\0' --name "m$i" --data-dir "$dir/m$i.data" \
				--listen-client-urls "$scheme://127.0.0.1:${cps[$i]}" \
				--advertise-client-urls "$scheme://127.0.0.1:${cps[$i]}" "${tlsflags[@]}" \
				--listen-peer-urls "http://127.0.0.1:${pps[$i]}" \
				--initial-advertise-peer-urls "http://127.0.0.1:${pps[$i]}" \
				--initial-cluster "$cluster" --initial-cluster-state new \
				--initial-cluster-token "dlock-test-$$-$try" ${DLOCK_ETCD_ARGS:-} >"$dir/m$i.args"
			: >"$dir/m$i.log"
			run_member "m$i"
			echo "m$i ${cps[$i]} $dir/m$i.pid" >>"$dir/members"
		done
		# Healthy, or a member gone (it could not bind), or 60 s.
		rc=0
		wait_healthy "$eps" $(seq -f 'm%g' 1 "$n") || rc=$?
		[ $rc = 0 ] && { started=1; break; }
		[ $rc = 2 ] && { echo "etcd $dead exited (try $try):" >&2; tail -3 "$dir/$dead.log" >&2; }
	done
	if [ -z "$started" ]; then
		echo "etcd cluster in $dir did not become healthy" >&2
		tail -20 "$dir"/m*.log >&2
		stop_all
		exit 1
	fi
	if [ -n "${DLOCK_ETCD_TLS:-}" ]; then
		echo "etcds://$clients/?cacert=$dir/ca.pem&cert=$dir/client.pem&key=$dir/client-key.pem" >"$dir/uri"
	else
		echo "etcd://$clients" >"$dir/uri"
	fi
	;;
members)
	[ -s "$dir/members" ] || { echo "no members in $dir" >&2; exit 1; }
	;;
restart-member)
	name=${3:?usage: etcd.sh restart-member DIR NAME}
	[ -r "$dir/$name.args" ] || { echo "no member $name in $dir" >&2; exit 1; }
	stop_pidfile "$dir/$name.pid"
	run_member "$name"
	port=$(awk -v m="$name" '$1 == m { print $2 }' "$dir/members")
	scheme=http ctlflags=()
	if [ -r "$dir/client.pem" ]; then
		scheme=https ctlflags=(--cacert "$dir/ca.pem" --cert "$dir/client.pem" --key "$dir/client-key.pem")
	fi
	wait_healthy "$scheme://127.0.0.1:$port" "$name" && exit 0
	echo "etcd member $name did not come back:" >&2
	tail -5 "$dir/$name.log" >&2
	exit 1
	;;
stop)
	stop_all
	;;
*)
	echo "usage: etcd.sh start|stop|restart-member DIR [MEMBERS|NAME]" >&2
	exit 64
	;;
esac
