#!/usr/bin/env bash
# postgres.sh start DIR | stop DIR — a throwaway PostgreSQL cluster for tests.
#
# initdb into DIR/data (as an unprivileged user when run as root: PostgreSQL
# refuses to run as root), unix socket in DIR/sock, TCP on a free loopback
# port, scram-sha-256 password auth, TLS on (ssl=on with a server certificate
# for 127.0.0.1 signed by a throw-away CA made here with openssl; plain
# connections stay allowed, except for the role dlock_tls, which pg_hba.conf
# rejects without TLS: tests/stores/postgres_tls.c creates it). Writes
#   DIR/uri        postgres://dlock:PASSWORD@127.0.0.1:PORT/dlock
#   DIR/admin_uri  the same URI (the dlock user is the cluster's superuser;
#                  tests use it for pg_terminate_backend)
#   DIR/ca.pem     the CA certificate (for sslmode=verify-full&sslrootcert=)
#   DIR/other-ca.pem  a CA that did not sign the server's certificate
# No system-wide service is started or touched.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

cmd=${1:?usage: postgres.sh start|stop DIR}
dir=${2:?usage: postgres.sh start|stop DIR}

bindir=
for d in /usr/lib/postgresql/*/bin; do
	[ -x "$d/initdb" ] && bindir=$d
done
[ -n "$bindir" ] && PATH=$bindir:$PATH
need initdb pg_ctl postgres psql openssl

# As root, run the server as a plain user (nobody, or $DLOCK_TEST_PG_USER).
as_user() {
	if [ "$(id -u)" -eq 0 ]; then
		(cd / && runuser -u "${DLOCK_TEST_PG_USER:-nobody}" -- "$@")
	else
		"$@"
	fi
}

# The cluster lives in $pg: DIR itself when we are not root; as root, a
# directory of its own under /tmp that the plain user can reach (DIR may sit
# below a directory only root may enter, such as a mktemp -d or /root).
cluster_dir() {
	if [ -f "$dir/pgroot" ]; then
		cat "$dir/pgroot"
	else
		echo "$dir"
	fi
}

case $cmd in
start)
	pg=$(cluster_dir)
	if [ -f "$pg/data/postmaster.pid" ]; then
		as_user pg_ctl -D "$pg/data" stop -m immediate >/dev/null 2>&1 || true
	fi
	[ "$pg" = "$dir" ] || rm -rf "$pg"
	rm -rf "$dir"
	mkdir -p "$dir"
	pg=$dir
	if [ "$(id -u)" -eq 0 ]; then
		pg=$(mktemp -d /tmp/dlock-pg.XXXXXX)
		chmod 755 "$pg"
		echo "$pg" >"$dir/pgroot"
	fi
	mkdir -p "$pg/sock"
	port=$(free_port)
	pass=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
	printf '%s\n' "$pass" >"$pg/pwfile"
	mkdir -p "$pg/tls"
	(
		cd "$pg/tls" &&
		openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=dlock-test-pg-ca \
			-keyout ca-key.pem -out ca.pem &&
		openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=dlock-test-other-ca \
			-keyout other-ca-key.pem -out other-ca.pem &&
		openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server-key.pem -out server.csr &&
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext &&
		openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
			-extfile server.ext -out server.pem &&
		chmod 600 server-key.pem
	) >"$dir/openssl.log" 2>&1 || { cat "$dir/openssl.log" >&2; exit 1; }
	cp "$pg/tls/ca.pem" "$dir/ca.pem"
	cp "$pg/tls/other-ca.pem" "$dir/other-ca.pem"
	if [ "$(id -u)" -eq 0 ]; then
		chown -R "${DLOCK_TEST_PG_USER:-nobody}" "$pg"
	fi
	as_user initdb -D "$pg/data" -U dlock --auth=scram-sha-256 --pwfile="$pg/pwfile" \
		-E UTF8 --no-locale >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
	# dlock_tls may only come in over TLS (first matching line wins).
	hba=$pg/data/pg_hba.conf
	{ echo "hostnossl all dlock_tls 127.0.0.1/32 reject"; cat "$hba"; } >"$hba.new"
	cat "$hba.new" >"$hba" && rm -f "$hba.new"
	# A free port can be taken by someone else before the server binds it: retry.
	up=0
	for attempt in 1 2 3 4 5; do
		if as_user pg_ctl -D "$pg/data" -l "$pg/server.log" -w -t 60 start \
			-o "-c listen_addresses=127.0.0.1 -p $port -k $pg/sock -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c ssl=on -c ssl_cert_file=$pg/tls/server.pem -c ssl_key_file=$pg/tls/server-key.pem" \
			>/dev/null; then
			up=1
			break
		fi
		port=$(free_port)
	done
	[ $up = 1 ] || { cat "$pg/server.log" >&2; exit 1; }
	PGPASSWORD=$pass as_user psql -q -h 127.0.0.1 -p "$port" -U dlock -d postgres \
		-c 'CREATE DATABASE dlock' >/dev/null
	echo "postgres://dlock:$pass@127.0.0.1:$port/dlock" >"$dir/uri"
	cp "$dir/uri" "$dir/admin_uri"
	echo "$port" >"$dir/port"
	;;
stop)
	pg=$(cluster_dir)
	if [ -f "$pg/data/postmaster.pid" ]; then
		as_user pg_ctl -D "$pg/data" stop -m fast -w -t 30 >/dev/null 2>&1 ||
			as_user pg_ctl -D "$pg/data" stop -m immediate >/dev/null 2>&1 || true
	fi
	[ "$pg" = "$dir" ] || rm -rf "$pg"
	rm -rf "$dir"
	;;
*)
	echo "usage: postgres.sh start|stop DIR" >&2
	exit 64
	;;
esac
