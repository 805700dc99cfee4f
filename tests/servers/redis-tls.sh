#!/usr/bin/env bash
# redis-tls.sh start DIR | stop DIR — redis-servers that speak TLS, for rediss://.
#
# Makes a throw-away CA in DIR/tls (lib.sh make_test_certs: ca.pem, server,
# expired, client certificates, other-ca.pem). Starts four
# servers (redis.sh with REDIS_TLS), each with a TLS port beside its plain one:
#   DIR/uri          rediss://127.0.0.1:T0/?cacert=DIR/tls/ca.pem
#   DIR/uri_mtls     the same for server 1, which requires a client certificate
#   DIR/uri_expired  the same for server 2, whose certificate has expired
#   DIR/uri_redlock  redlock:// over servers 0, 1 and 3 with tls=yes and the client certificate
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

cmd=${1:?usage: redis-tls.sh start|stop DIR}
dir=${2:?usage: redis-tls.sh start|stop DIR}

case $cmd in
start)
	need openssl faketime redis-server
	t=$dir/tls
	rm -rf "$dir"
	make_test_certs "$t" || exit 1
	REDIS_TLS=$t bash "$here/redis.sh" start "$dir" 4 || exit 1
	tp() { cat "$dir/$1/tls_port"; }
	q="cacert=$t/ca.pem"
	echo "rediss://127.0.0.1:$(tp 0)/?$q" >"$dir/uri"
	echo "rediss://127.0.0.1:$(tp 1)/?$q" >"$dir/uri_mtls"
	echo "rediss://127.0.0.1:$(tp 2)/?$q" >"$dir/uri_expired"
	echo "redlock://127.0.0.1:$(tp 0),127.0.0.1:$(tp 1),127.0.0.1:$(tp 3)/?tls=yes&$q&cert=$t/client.pem&key=$t/client.key" \
		>"$dir/uri_redlock"
	;;
stop)
	bash "$here/redis.sh" stop "$dir"
	;;
*)
	echo "unknown command: $cmd" >&2
	exit 64
	;;
esac
