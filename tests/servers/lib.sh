# Shared helpers for the server scripts: sourced, not run.
# Each tests/servers/<kind>.sh implements
#   <kind>.sh start DIR   start the server(s) under DIR on free loopback ports,
#                         wait until they answer, write the store URI to DIR/uri
#   <kind>.sh stop DIR    stop them (and anything they started) and leave DIR
# A missing server binary is an error (exit 1), never a skip.

set -eu

# free_port: print a TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	echo "no free port found" >&2
	return 1
}

# wait_port PORT [SECONDS]: wait until something accepts on 127.0.0.1:PORT.
wait_port() {
	local port=$1 secs=${2:-30} i
	for i in $(seq 1 $((secs * 10))); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			return 0
		fi
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

# stop_pidfile FILE: TERM the pid in FILE, then KILL after 10 s.
stop_pidfile() {
	local f=$1 pid i
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	kill -CONT "$pid" 2>/dev/null || true
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return 0; }
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$f"
}
