#!/bin/bash
# A store that accepts connections and never answers (every route of a
# faultproxy in blackhole): `acquire --wait 1s` and `run --wait 1s` give up
# within about a second with exit 69 on every network store compiled in —
# the open is cut to the wait, and no request outlives it.
#   hung.sh DLOCK FAULTPROXY
. "$(dirname "$0")/lib.sh" "$@"
PROXY=${2:?usage: hung.sh DLOCK FAULTPROXY}

FAULTPROXY_BLACKHOLE=1 "$PROXY" "$T/ctl" 127.0.0.1:1 127.0.0.1:1 127.0.0.1:1 >"$T/ports" 2>"$T/proxy.err" &
for _ in $(seq 1 100); do grep -q ready "$T/ports" 2>/dev/null && break; sleep 0.05; done
check "the proxy started" grep -q ready "$T/ports"
mapfile -t P <"$T/ports"

uris=(
	"redis://127.0.0.1:${P[0]}"
	"redlock://127.0.0.1:${P[0]},127.0.0.1:${P[1]},127.0.0.1:${P[2]}"
	"etcd://127.0.0.1:${P[0]}"
	"zk://127.0.0.1:${P[0]}"
	"postgres://dlock:secret@127.0.0.1:${P[0]}/dlock"
	"postgres://dlock:secret@127.0.0.1:${P[0]}/dlock?mode=advisory"
	"mysql://dlock:secret@127.0.0.1:${P[0]}/dlock"
	"mysql://dlock:secret@127.0.0.1:${P[0]}/dlock?mode=get_lock"
	"memcached://127.0.0.1:${P[0]}"
)
# Each bound is the wait, its 50 ms, and twice the fixed cost of a `dlock
# run` on the embedded store in this run (lib.sh), measured again per store:
# starting, opening and exiting a process is scheduling, not the bound.
measure_sched
for u in "${uris[@]}"; do
	# a store this build was compiled without says so at once (before any
	# connect): nothing to time. Two seconds are ample for that answer; a store
	# that was built would wait out its connect timeout on the black hole.
	if timeout 2 "$DLOCK" --store "$u" status 2>&1 | grep -q "built without"; then
		continue
	fi
	for cmd in "acquire --wait 1s hung" "run --wait 1s hung -- true"; do
		t0=$(now_ms)
		# shellcheck disable=SC2086
		expect_rc 69 "$cmd on a hung ${u%%:*} store" "$DLOCK" --store "$u" $cmd
		t=$(( $(now_ms) - t0 ))
		check "$cmd on a hung ${u%%://*} store gave up in ${t} ms (wait 1 s; bound 1050 + 2 x $sched)" \
			[ "$t" -le $((1050 + 2 * sched)) ]
	done
	measure_sched >/dev/null
done
kill %1 2>/dev/null
finish
