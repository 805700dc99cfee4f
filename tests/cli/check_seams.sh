#!/bin/bash
# `dlock check` at the seams (issue 30): the ops and faults that found the
# seam bugs, each run briefly on the store it applies to, on real servers.
# What is asserted is that the fault or op really happened (its count in the
# JSON report is > 0) and that the report is whole (valid JSON, a verdict of
# pass, fail or incomplete): while the fixes of the seams land, a run may
# find real violations (the tool working), so the verdict itself is only
# asserted where nothing else is at work (SQLite's usage errors, a fault with
# no time to run must not pass).
#
# CHECK_SEAMS_STORE picks the part:
#   sqlite     (default) usage errors; --ops extend,handle (the renewal held
#              up by SQLite's write lock taken from the sqlite3 shell);
#              --faults kill-tool (SIGKILL of `dlock run`, its command
#              ignoring SIGTERM; the command's death is observed); a fault
#              that never ran makes the verdict incomplete, never pass
#   redis      two private redis-servers, the second a replica of the first:
#              --ops extend through the fault proxy (the worker's link lagged
#              when its renewal is due) and --faults failback (fence_replicas=1,
#              wait_replicas=0)
#   memcached  a private memcached of 2 MB that may evict (no -M): --faults evict
#   postgres / mysql  the store suite's server (CLI_TEST_URI_FILE,
#              advisory / get_lock): --faults session-kill
. "$(dirname "$0")/lib.sh" "$@"
servers=$(cd "$(dirname "$0")/../servers" && pwd)
part=${CHECK_SEAMS_STORE:-sqlite}

# jf KEY FILE: first value of "KEY": in FILE (numbers, true/false, strings unquoted).
jf() { grep -o "\"$1\":\"\?[^,\"}]*" "$2" | head -1 | sed 's/^"[^"]*":"\{0,1\}//'; }
# oks KIND FILE: faults of that kind carried out.
oks() { grep -o "{\"kind\":\"$1\",[^}]*\"ok\":true" "$2" | wc -l; }
# counts KIND FILE: the sum of the counts of that kind's faults carried out.
counts() { grep -o "{\"kind\":\"$1\",[^}]*\"ok\":true[^}]*" "$2" | grep -o '"count":[0-9-]*' | cut -d: -f2 |
	awk '{ s += $1 } END { print s + 0 }'; }
# whole NAME: the report is one JSON object with a verdict; the exit code
# follows the verdict (0 pass, 1 fail or incomplete).
whole() {
	local f=$T/$1.out rc
	rc=$(cat "$T/$1.rc")
	check "$1: valid JSON ($(head -c 200 "$T/$1.err"))" python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$f"
	local v; v=$(jf verdict "$f")
	check "$1: a verdict ($v)" bash -c "[ '$v' = pass ] || [ '$v' = fail ] || [ '$v' = incomplete ]"
	check "$1: exit $rc follows the verdict $v" bash -c "{ [ '$v' = pass ] && [ $rc = 0 ]; } || { [ '$v' != pass ] && [ $rc = 1 ]; }"
	check "$1: grants ($(jf grants "$f"))" [ "$(jf grants "$f")" -gt 0 ]
	[ -s "$f" ] || echo "$1: stderr: $(tail -5 "$T/$1.err")"
	echo "$1: verdict $v; overlaps $(jf overlaps "$f"), fences out of order $(jf fence_order_violations "$f"), not run: $(jf not_run_why "$f")"
}
# run NAME ARGS...: dlock --json ARGS, output in $T/NAME.out, exit code in $T/NAME.rc.
run() {
	local n=$1; shift
	"$DLOCK" --json "$@" >"$T/$n.out" 2>"$T/$n.err"
	echo $? >"$T/$n.rc"
}
S=(check --clients 3 --ttl 400ms --hold 40ms)

case $part in
sqlite)
	expect_rc 64 "unknown op" "$DLOCK" check --ops nap
	check "names the bad op" grep -q "unknown op 'nap'" "$T/err"
	expect_rc 64 "session-kill on SQLite" "$DLOCK" check --faults session-kill
	check "says why session-kill is not available" grep -q "session-kill: not available on this store" "$T/err"
	expect_rc 64 "evict on SQLite" "$DLOCK" check --faults evict
	check "says evict needs memcached" grep -q "evict: not available on this store" "$T/err"
	expect_rc 64 "failback without a topology" "$DLOCK" check --faults failback
	check "says the topology is not given" grep -q "failback: the topology is not given" "$T/err"
	expect_rc 0 "--help" "$DLOCK" check --help
	for w in kill-tool session-kill evict failback "--ops" "--replica"; do
		check "help names $w" grep -q -- "$w" "$T/out"
	done
	run ext --store "sqlite://$T/ext.db" "${S[@]}" --duration 4s --ops extend,handle --seed 3 &
	run kt --store "sqlite://$T/kt.db" "${S[@]}" --duration 5s --faults kill-tool --fault-every 1500ms --seed 4 &
	wait
	whole ext
	check "extend: extended holds ($(jf extend "$T/ext.out"))" [ "$(jf extend "$T/ext.out")" -gt 0 ]
	check "extend: renewals delayed ($(jf renewals_delayed "$T/ext.out"))" [ "$(jf renewals_delayed "$T/ext.out")" -gt 0 ]
	check "handle: holds through handles ($(jf handle "$T/ext.out"))" [ "$(jf handle "$T/ext.out")" -gt 0 ]
	check "extends done ($(jf extends "$T/ext.out"))" [ "$(jf extends "$T/ext.out")" -gt 0 ]
	check "ops named in the report" grep -q '"ops":"extend,handle"' "$T/ext.out"
	check "extend: nothing left not run" [ "$(jf not_run "$T/ext.out")" = 0 ]
	whole kt
	check "kill-tool: carried out ($(oks kill-tool "$T/kt.out"))" [ "$(oks kill-tool "$T/kt.out")" -gt 0 ]
	check "kill-tool: holds of dlock run ($(jf run "$T/kt.out"))" [ "$(jf run "$T/kt.out")" -gt 0 ]
	check "kill-tool: the command's death is noted" grep -q 'its command (ignoring SIGTERM) died [0-9]* ms later' "$T/kt.out"
	# too short for its fault: refused before the run, never a pass
	expect_rc 64 "short: refused before the run" "$DLOCK" --store "sqlite://$T/short.db" "${S[@]}" \
		--duration 300ms --faults kill-tool --seed 5
	check "short: names kill-tool and the time it needs" grep -q -- "--faults kill-tool: not every kind can run in --duration 0.3s: one of each takes [0-9.]*s" "$T/err"
	check "short: no grant happened" bash -c "! grep -q verdict '$T/out'"
	;;
redis)
	rs=$T/redis
	bash "$servers/redis.sh" start "$rs" 2 >"$T/rs.log" 2>&1 || { fail "redis-servers did not start: $(tail -3 "$T/rs.log")"; finish; }
	p0=$(cat "$rs/0/port") p1=$(cat "$rs/1/port")
	redis-cli -p "$p1" replicaof 127.0.0.1 "$p0" >/dev/null
	for _ in $(seq 1 100); do redis-cli -p "$p1" info replication | grep -q master_link_status:up && break; sleep 0.1; done
	uri="redis://127.0.0.1:$p0"
	run ext --store "$uri" "${S[@]}" --duration 4s --ops extend,handle --seed 3 &
	run fb --store "$uri?fence_replicas=1&wait_replicas=0" "${S[@]}" --duration 6s --faults failback \
		--replica "127.0.0.1:$p1" --fault-every 1500ms --seed 4 &
	wait
	expect_rc 64 "failback: a master as --replica" "$DLOCK" --store "$uri" check --faults failback --replica "127.0.0.1:$p0"
	check "says it is not a replica" grep -q "is not a replica" "$T/err"
	bash "$servers/redis.sh" stop "$rs" >/dev/null 2>&1
	whole ext
	check "extend: renewals delayed through the proxy ($(jf renewals_delayed "$T/ext.out"))" [ "$(jf renewals_delayed "$T/ext.out")" -gt 0 ]
	check "extend: extends done ($(jf extends "$T/ext.out"))" [ "$(jf extends "$T/ext.out")" -gt 0 ]
	whole fb
	check "failback: carried out ($(oks failback "$T/fb.out"))" [ "$(oks failback "$T/fb.out")" -gt 0 ]
	check "failback: the note says so" grep -q 'demoted to a replica of 127.0.0.1:[0-9]*, resynced, promoted back' "$T/fb.out"
	;;
memcached)
	port=
	for _ in 1 2 3 4 5; do
		port=$(bash -c ". '$servers/lib.sh'; free_port")
		user=(); [ "$(id -u)" -eq 0 ] && user=(-u nobody)
		memcached -l 127.0.0.1 -p "$port" -U 0 -m 2 -t 1 "${user[@]}" >"$T/mc.log" 2>&1 &
		mpid=$!
		up=0
		for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { up=1; break; }; sleep 0.1; done
		[ $up = 1 ] && break
		kill "$mpid" 2>/dev/null
	done
	[ "$up" = 1 ] || { fail "memcached did not start: $(cat "$T/mc.log")"; finish; }
	run ev --store "memcached://127.0.0.1:$port" "${S[@]}" --ttl 1s --duration 6s --ops extend --faults evict \
		--fault-every 1500ms --seed 3
	kill "$mpid"
	whole ev
	check "evict: carried out ($(oks evict "$T/ev.out"))" [ "$(oks evict "$T/ev.out")" -gt 0 ]
	check "evict: keys evicted ($(counts evict "$T/ev.out"))" [ "$(counts evict "$T/ev.out")" -gt 0 ]
	;;
postgres | mysql)
	[ -n "${DLOCK_STORE:-}" ] || { fail "CLI_TEST_URI_FILE is not set"; finish; }
	run sk "${S[@]}" --duration 5s --faults session-kill --fault-every 1200ms --seed 3
	whole sk
	check "session-kill: carried out ($(oks session-kill "$T/sk.out"))" [ "$(oks session-kill "$T/sk.out")" -gt 0 ]
	check "session-kill: sessions killed ($(counts session-kill "$T/sk.out"))" [ "$(counts session-kill "$T/sk.out")" -gt 0 ]
	;;
*)
	fail "unknown CHECK_SEAMS_STORE '$part'"
	;;
esac
finish
