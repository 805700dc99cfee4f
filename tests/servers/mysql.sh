#!/usr/bin/env bash
# MariaDB for the mysql store tests: a private data dir under DIR, a server on
# a free loopback port (and a socket in DIR), a database `dlock_test` and a
# user `dlock` with a password. Works as an ordinary user and as root (CI):
# as root mariadbd must be told --user=root, or it refuses to start.
#   mysql.sh start DIR   writes DIR/uri  (mysql://dlock:PASS@127.0.0.1:PORT/dlock_test);
#                        DIR/sock is the server's socket (root, no password: KILL
#                        and table checks in tests); DIR/ca.pem the CA of its TLS cert
#   mysql.sh restart DIR (stop and start again on the same data and port)
#   mysql.sh stop DIR
. "$(dirname "$0")/lib.sh"

cmd=${1:?usage: mysql.sh start|restart|stop DIR}
dir=${2:?usage: mysql.sh start|restart|stop DIR}

find_prog() {
	local p
	for p in "$@"; do
		command -v "$p" 2>/dev/null && return 0
		[ -x "/usr/sbin/$p" ] && { echo "/usr/sbin/$p"; return 0; }
	done
	echo "missing server program: $1 (apt-get install mariadb-server mariadb-client)" >&2
	exit 1
}

# run_server PORT: start mariadbd on the data dir of $dir and wait for it.
# Returns 2 when the server died at start (its port taken: pick another).
run_server() {
	local port=$1 server userarg=() rc=0
	server=$(find_prog mariadbd mysqld)
	[ "$(id -u)" -eq 0 ] && userarg=(--user=root)
	# Small buffers: the test server shares 2 cores and little memory with others.
	"$server" --no-defaults --datadir="$dir/data" --socket="$dir/sock" --port="$port" \
		--bind-address=127.0.0.1 --pid-file="$dir/mariadbd.pid" --tmpdir="$dir/tmp" \
		--log-error="$dir/error.log" --skip-name-resolve --innodb-buffer-pool-size=32M \
		--innodb-log-file-size=16M --max-connections=500 \
		--ssl-ca="$dir/ca.pem" --ssl-cert="$dir/server.pem" --ssl-key="$dir/server-key.pem" \
		"${userarg[@]}" >>"$dir/stderr.log" 2>&1 &
	echo $! >"$dir/pid"
	wait_up "$port" "$(cat "$dir/pid")" 60 || rc=$?
	[ $rc = 0 ] && return 0
	stop_pidfile "$dir/pid"
	[ $rc = 2 ] && grep -q 'Address already in use' "$dir/error.log" 2>/dev/null && return 2
	cat "$dir/stderr.log" "$dir/error.log" >&2 2>/dev/null
	exit 1
}

case $cmd in
start)
	installdb=$(find_prog mariadb-install-db mysql_install_db)
	client=$(find_prog mariadb mysql)
	[ -f "$dir/pid" ] && stop_pidfile "$dir/pid"
	rm -rf "$dir"
	mkdir -p "$dir/data" "$dir/tmp"
	userarg=()
	[ "$(id -u)" -eq 0 ] && userarg=(--user=root)
	find_prog mariadbd mysqld >/dev/null
	"$installdb" --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal \
		--skip-test-db --skip-name-resolve "${userarg[@]}" >"$dir/install.log" 2>&1 || {
		cat "$dir/install.log" >&2; exit 1; }
	# TLS: a throw-away CA and a server certificate for 127.0.0.1, so the tests can
	# check ssl=required / ssl_ca verification against a real handshake.
	need openssl
	(
		cd "$dir"
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
			-subj "/CN=dlock test CA" -keyout ca-key.pem -out ca.pem
		openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
			-subj "/CN=127.0.0.1" -keyout server-key.pem -out server.csr
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
		openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 7 \
			-extfile server.ext -out server.pem
	) >"$dir/tls.log" 2>&1 || { cat "$dir/tls.log" >&2; exit 1; }
	for attempt in 1 2 3 4 5; do # a free port can be taken before we bind it
		port=$(free_port)
		rc=0
		run_server "$port" || rc=$?
		[ $rc = 0 ] && break
		[ $attempt -lt 5 ] || { cat "$dir/error.log" >&2; exit 1; }
		: >"$dir/error.log"
	done
	pass=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
	for i in $(seq 1 50); do
		"$client" --no-defaults -uroot --socket="$dir/sock" -e 'SELECT 1' >/dev/null 2>&1 && break
		sleep 0.1
	done
	"$client" --no-defaults -uroot --socket="$dir/sock" <<SQL
CREATE DATABASE dlock_test;
CREATE USER 'dlock'@'127.0.0.1' IDENTIFIED BY '$pass';
CREATE USER 'dlock'@'localhost' IDENTIFIED BY '$pass';
GRANT ALL ON dlock_test.* TO 'dlock'@'127.0.0.1';
GRANT ALL ON dlock_test.* TO 'dlock'@'localhost';
FLUSH PRIVILEGES;
SQL
	echo "mysql://dlock:$pass@127.0.0.1:$port/dlock_test" >"$dir/uri"
	echo "$port" >"$dir/port"
	;;
stop)
	stop_pidfile "$dir/pid"
	;;
restart)
	# Same data, same port: for tests of what survives a server restart.
	stop_pidfile "$dir/pid"
	run_server "$(cat "$dir/port")" || { cat "$dir/error.log" >&2; exit 1; }
	;;
*)
	echo "usage: mysql.sh start|restart|stop DIR" >&2
	exit 64
	;;
esac
