#!/usr/bin/env bash
# MariaDB for the mysql store tests: a private data dir under DIR, a server on
# a free loopback port (and a socket in DIR), a database `dlock_test` and a
# user `dlock` with a password. Works as an ordinary user and as root (CI):
# as root mariadbd must be told --user=root, or it refuses to start.
#   mysql.sh start DIR   writes DIR/uri  (mysql://dlock:PASS@127.0.0.1:PORT/dlock_test)
#                        and DIR/admin_uri (root, no password, for KILL in tests)
#   mysql.sh stop DIR
. "$(dirname "$0")/lib.sh"

cmd=${1:?usage: mysql.sh start|stop DIR}
dir=${2:?usage: mysql.sh start|stop DIR}

find_prog() {
	local p
	for p in "$@"; do
		command -v "$p" 2>/dev/null && return 0
		[ -x "/usr/sbin/$p" ] && { echo "/usr/sbin/$p"; return 0; }
	done
	echo "missing server program: $1 (apt-get install mariadb-server mariadb-client)" >&2
	exit 1
}

case $cmd in
start)
	server=$(find_prog mariadbd mysqld)
	installdb=$(find_prog mariadb-install-db mysql_install_db)
	client=$(find_prog mariadb mysql)
	[ -f "$dir/pid" ] && stop_pidfile "$dir/pid"
	rm -rf "$dir"
	mkdir -p "$dir/data" "$dir/tmp"
	userarg=()
	[ "$(id -u)" -eq 0 ] && userarg=(--user=root)
	"$installdb" --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal \
		--skip-test-db --skip-name-resolve "${userarg[@]}" >"$dir/install.log" 2>&1 || {
		cat "$dir/install.log" >&2; exit 1; }
	port=$(free_port)
	# Small buffers: the test server shares 2 cores and little memory with others.
	"$server" --no-defaults --datadir="$dir/data" --socket="$dir/sock" --port="$port" \
		--bind-address=127.0.0.1 --pid-file="$dir/mariadbd.pid" --tmpdir="$dir/tmp" \
		--log-error="$dir/error.log" --skip-name-resolve --innodb-buffer-pool-size=32M \
		--innodb-log-file-size=16M --max-connections=500 "${userarg[@]}" &
	echo $! >"$dir/pid"
	if ! wait_port "$port" 60; then
		cat "$dir/error.log" >&2
		stop_pidfile "$dir/pid"
		exit 1
	fi
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
	echo "mysql://root@127.0.0.1:$port/dlock_test" >"$dir/admin_uri"
	echo "$port" >"$dir/port"
	;;
stop)
	stop_pidfile "$dir/pid"
	;;
*)
	echo "usage: mysql.sh start|stop DIR" >&2
	exit 64
	;;
esac
