# Shared helpers for the server scripts: sourced, not run.
# Each tests/servers/<kind>.sh implements
#   <kind>.sh start DIR   start the server(s) under DIR on free loopback ports,
#                         wait until they answer, write the store URI to DIR/uri
#   <kind>.sh stop DIR    stop them (and anything they started) and leave DIR
# A missing server binary is an error (exit 1), never a skip.

set -eu

# free_port: print a TCP port on 127.0.0.1 that nothing listens on now. It is
# drawn from below the kernel's ephemeral range, so an outgoing connection of
# some other test cannot take it between this look and the server's bind; a
# server started on it may still lose it to another fixture, so callers retry
# when the server dies at start (see wait_up).
free_port() {
	local lo p span
	read -r lo _ </proc/sys/net/ipv4/ip_local_port_range
	span=$(( lo - 10000 ))
	[ "$span" -ge 1000 ] || { lo=61000; span=4000; }
	for _ in $(seq 1 200); do
		p=$(( lo - 1 - (RANDOM * 32768 + RANDOM) % span ))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	echo "no free port found" >&2
	return 1
}

# wait_up PORT PID [SECONDS]: wait until 127.0.0.1:PORT accepts. Returns 0 once
# it does, 2 as soon as process PID has gone (it failed to start, typically
# because the port was taken: the caller picks another and retries), 1 when
# SECONDS pass with the process alive and the port still closed. An empty PID
# (a server that daemonizes) is not watched.
wait_up() {
	local port=$1 pid=$2 secs=${3:-30} i
	for i in $(seq 1 $((secs * 10))); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			return 0
		fi
		[ -z "$pid" ] || alive "$pid" || return 2
		sleep 0.1
	done
	echo "nothing listening on 127.0.0.1:$port after ${secs}s" >&2
	return 1
}

# need BINARY...: fail clearly when a server program is missing.
need() {
	local b
	for b in "$@"; do
		command -v "$b" >/dev/null 2>&1 || { echo "missing server program: $b (install it; see README)" >&2; exit 1; }
	done
}

# alive PID: the process runs. A zombie whose threads have all ended does
# not (this machine's init reaps orphans up to two seconds late, and kill -0
# succeeds on a zombie); a zombie leader whose other threads still exit does
# (they may still hold its ports and files).
alive() {
	local st tasks
	st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
	[ -n "$st" ] || return 1
	[ "${st%% *}" != Z ] && return 0
	tasks=(/proc/"$1"/task/*)
	[ "${#tasks[@]}" -gt 1 ]
}

# stop_pidfile FILE: TERM the pid in FILE, then KILL after 10 s.
stop_pidfile() {
	local f=$1 pid i
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	kill -CONT "$pid" 2>/dev/null || true
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 1 100); do
		alive "$pid" || { rm -f "$f"; return 0; }
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$f"
}

# make_test_certs DIR: a throw-away CA for TLS servers, made with openssl in DIR:
# ca.pem; server.pem/.key for 127.0.0.1 and localhost; expired.pem/.key, the
# same but expired ten days ago (signed under faketime); client.pem/.key for
# mutual TLS; other-ca.pem, a CA that signed none of them. Keys readable by
# the server's user. Output goes to DIR/openssl.log (shown on failure).
make_test_certs() {
	local t=$1
	mkdir -p "$t"
	(
		cd "$t" || exit 1
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >san.cnf
		printf 'extendedKeyUsage=clientAuth\n' >client.cnf
		openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3 -subj "/CN=dlock test CA" &&
			openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 3 \
				-subj "/CN=another CA" &&
			for c in server expired client; do
				openssl req -newkey rsa:2048 -nodes -keyout $c.key -out $c.csr -subj "/CN=$c" || exit 1
			done &&
			openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
				-days 3 -extfile san.cnf &&
			faketime -f -10d openssl x509 -req -in expired.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
				-out expired.pem -days 1 -extfile san.cnf &&
			openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem \
				-days 3 -extfile client.cnf
	) >"$t/openssl.log" 2>&1 || { cat "$t/openssl.log" >&2; return 1; }
	chmod 0644 "$t"/*.key
}
