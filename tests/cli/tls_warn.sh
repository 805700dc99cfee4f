#!/usr/bin/env bash
# dlock warns once on stderr when a store handle sends its password or lock
# traffic to another host over a connection that does not verify the server
# (issue 21 row 7; dlock_store_warning): PostgreSQL's default sslmode=prefer,
# MySQL without ssl=verify, Redis with a password over plain TCP. The
# servers of the store suites are reached through this machine's own
# non-loopback address (a forwarder, tls_warn.py), which counts as another
# host; the same servers on 127.0.0.1 get no warning, nor does -q.
#   tls_warn.sh DLOCK PG_URI_FILE MYSQL_URI_FILE
set -u
dlock=${1:?dlock} pgf=${2:?postgres uri file} myf=${3:?mysql uri file}
here=$(cd "$(dirname "$0")" && pwd)
ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$' | grep -v '^127\.' | head -1)
[ -n "$ip" ] || { echo "FAIL: this machine has no non-loopback IPv4 address to play the other host"; exit 1; }
work=$(mktemp -d /tmp/dlock-tlswarn-XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	[ -f "$work/redis.pid" ] && kill "$(cat "$work/redis.pid")" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# forward HOST PORT: start a forwarder on $ip to HOST:PORT (in this shell, so
# that cleanup stops it); its port is then $fwd
forward() {
	python3 "$here/tls_warn.py" "$ip" "$1" "$2" >"$work/fwd.$2" </dev/null 2>/dev/null &
	pids+=($!)
	local i
	fwd=0
	for ((i = 0; i < 100; i++)); do
		[ -s "$work/fwd.$2" ] && { fwd=$(head -1 "$work/fwd.$2"); return; }
		sleep 0.05
	done
}
# check NAME URI WANT(warn|quiet) WORD [dlock options...]: `dlock status` on URI
check() {
	local name=$1 uri=$2 want=$3 word=$4
	shift 4
	"$dlock" status --store "$uri" "$@" x >"$work/out" 2>"$work/err"
	local rc=$? n
	n=$(grep -c '^dlock: warning:' "$work/err")
	if [ "$want" = warn ]; then
		{ [ $rc = 0 ] && [ "$n" = 1 ] && grep -q -- "$word" "$work/err"; } ||
			fail "$name: exit $rc, $n warning(s), want one naming '$word': $(cat "$work/err")"
	else
		{ [ $rc = 0 ] && [ "$n" = 0 ]; } || fail "$name: exit $rc, $n warning(s), want none: $(cat "$work/err")"
	fi
	grep -q 'warning' "$work/out" && fail "$name: a warning on stdout"
}
hostport() { local hp=${1#*@}; hp=${hp#*://}; echo "${hp%%/*}"; }
swap() { # URI HOST:PORT -> URI with that authority's host:port replaced
	local u=$1 old=$(hostport "$1")
	echo "${u/$old/$2}"
}

# PostgreSQL: default sslmode=prefer (the suite's server has no TLS: plain)
pg=$(cat "$pgf")
pgp=$(hostport "$pg")
forward 127.0.0.1 "${pgp##*:}"
pport=$fwd
check "postgres via $ip, default sslmode" "$(swap "$pg" "$ip:$pport")" warn 'sslmode=verify-full'
check "postgres via $ip, sslmode=disable" "$(swap "$pg" "$ip:$pport")?sslmode=disable" warn 'sslmode=disable'
check "postgres on 127.0.0.1" "$pg" quiet ''
check "postgres via $ip with -q" "$(swap "$pg" "$ip:$pport")" quiet '' -q

# MySQL/MariaDB: no TLS by default
my=$(cat "$myf")
myp=$(hostport "$my")
forward 127.0.0.1 "${myp##*:}"
mport=$fwd
check "mysql via $ip, default" "$(swap "$my" "$ip:$mport")" warn 'ssl=verify'
check "mysql on 127.0.0.1" "$my" quiet ''

# Redis with a password over plain TCP (a server of this test's own)
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --requirepass s3cret --save '' --appendonly no \
	--daemonize yes --pidfile "$work/redis.pid" --dir "$work" >/dev/null
for ((i = 0; i < 100; i++)); do redis-cli -p "$rport" -a s3cret --no-auth-warning ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
forward 127.0.0.1 "$rport"
fport=$fwd
check "redis via $ip with a password" "redis://:s3cret@$ip:$fport" warn 'use rediss://'
check "redis on 127.0.0.1 with a password" "redis://:s3cret@127.0.0.1:$rport" quiet ''
grep -q s3cret "$work/err" && fail "redis: the password in a message"

[ $fails = 0 ] && echo "cli.tls_warn: all checks passed" || echo "cli.tls_warn: $fails check(s) FAILED"
[ $fails = 0 ]
