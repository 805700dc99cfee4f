#!/bin/bash
# `dlock check` on the embedded SQLite store, kept short (a few seconds per
# run): bad usage is refused; a clean run passes; a SIGSTOP pause longer than
# the TTL makes holds overlap, which fences render harmless (fencing on: exit
# 0, stale writes refused) and which corrupt the register without them
# (fencing off: exit 1, stale write accepted, lost update); a SIGKILLed holder
# is replaced and the lock is granted again within about one TTL; a seed
# repeats the fault schedule; a store that grants twice is caught (also
# under the network faults, which never excuse an overlap); deleting the
# database file under a holder must not split the store in two for good;
# SIGTERM mid-run prints the results so far and leaves no worker behind.
# Every requested fault kind runs (the summary counts each) or the run is
# refused before it starts, naming the kind and why (64); real violations
# come first, the overlaps a pause excuses in a section of their own, in the
# terminal and in the report; every hold bar of the report shows its fence.
#
# With CLI_TEST_URI_FILE (cli.check.redis, the redis server of the store
# suite) only the network part at the end runs: partition, lose-reply and
# delay through the proxy built into dlock, and server-pause on a private
# redis-server (stopping the suite's shared one would stall other tests).
. "$(dirname "$0")/lib.sh" "$@"

# jfield KEY: first value of "KEY": in $T/out (numbers, true/false, strings unquoted).
jfield() { grep -o "\"$1\":\"\?[^,\"}]*" "$T/out" | head -1 | sed 's/^"[^"]*":"\{0,1\}//'; }
# faults_of KIND FILE: the fault objects of that kind that were carried out, one a line.
faults_of() { grep -o "{\"kind\":\"$1\",[^}]*\"ok\":true[^}]*}" "$2"; }
# fvals KEY: the values of KEY in the fault objects on stdin, one a line.
fvals() { grep -o "\"$1\":[0-9.-]*" | cut -d: -f2; }

if [ -n "${DLOCK_STORE:-}" ]; then
	servers=$(cd "$(dirname "$0")/../servers" && pwd)
	# 6 s: room for a second fault of each kind even when the first comes
	# late on a loaded machine (a fault of 1 s must start 2.05 s before the
	# end; the second starts about 2.8 s in)
	N=(--json check --clients 3 --ttl 500ms --hold 50ms --duration 6s --fault-every 1s)
	# nbg NAME ARGS...: dlock check on $DLOCK_STORE in the background (own lock name each).
	nbg() {
		local n=$1; shift
		( "$DLOCK" "${N[@]}" "$@" >"$T/$n.out" 2>"$T/$n.err"; echo $? >"$T/$n.rc" ) &
	}
	nbg part --faults partition --seed 1
	nbg lose --faults lose-reply --seed 2
	nbg delay --faults delay --delay 150ms --seed 3
	rs=$T/redis-own
	if bash "$servers/redis.sh" start "$rs" >"$T/rs.log" 2>&1; then
		( "$DLOCK" --store "$(cat "$rs/uri")" "${N[@]}" --faults server-pause --pause 700ms --seed 4 \
			--server-script "$servers/redis.sh" --server-dir "$rs" >"$T/spause.out" 2>"$T/spause.err"
		  echo $? >"$T/spause.rc" ) &
	else
		fail "private redis-server did not start: $(tail -3 "$T/rs.log")"
	fi
	wait
	[ -d "$rs" ] && bash "$servers/redis.sh" stop "$rs" >/dev/null 2>&1
	# The four kinds of the issue, with 1.7 s to spare over the 4.8 s they
	# need (a holder found late on a loaded machine): each runs
	# (alone: the runs above leave little room for a late fault).
	"$DLOCK" "${N[@]}" --duration 6.5s --ttl 300ms --hold 40ms --faults partition,lose-reply,kill,pause \
		--seed 1 >"$T/four.out" 2>"$T/four.err"
	echo $? >"$T/four.rc"
	# Each kind: carried out at least twice, grants within 2 s after each,
	# no overlap, the register exact, exit 0.
	for n in part:partition lose:lose-reply delay:delay spause:server-pause; do
		f=${n#*:} n=${n%%:*}
		[ -f "$T/$n.rc" ] || continue
		cp "$T/$n.out" "$T/out"
		rc=$(cat "$T/$n.rc")
		check "$f: exit 0 ($rc; $(head -c 300 "$T/$n.err"))" [ "$rc" = 0 ]
		nf=$(faults_of "$f" "$T/out" | wc -l)
		check "$f: injected at least twice ($nf)" [ "$nf" -ge 2 ]
		heals=$(faults_of "$f" "$T/out" | fvals heal_to_grant_ms | tr '\n' ' ')
		check "$f: a grant within 2 s after each ($heals)" awk -v h="$heals" \
			'BEGIN { n = split(h, a, " "); for (i = 1; i <= n; i++) if (a[i] < 0 || a[i] > 2000) exit 1; exit !(n > 0) }'
		check "$f: no overlap ($(jfield overlaps))" [ "$(jfield overlaps)" = 0 ]
		check "$f: grants ($(jfield grants))" [ "$(jfield grants)" -gt 5 ]
		check "$f: final value = accepted writes" [ "$(jfield final_value)" = "$(jfield accepted)" ]
	done
	# The black hole and the lost replies really discarded traffic.
	d=$(faults_of partition "$T/part.out" | fvals dropped_bytes | awk '{ s += $1 } END { print s + 0 }')
	check "partition: bytes discarded ($d)" [ "$d" -gt 0 ]
	d=$(faults_of lose-reply "$T/lose.out" | fvals dropped_bytes | awk '{ s += $1 } END { print s + 0 }')
	check "lose-reply: replies discarded ($d)" [ "$d" -gt 0 ]
	check "delay: 150ms each way" grep -q '"note":"150ms each way' "$T/delay.out"
	check "server-pause: the server was stopped" grep -q '"note":"1 server process stopped for 700ms"' "$T/spause.out"
	check "four kinds: exit 0 ($(cat "$T/four.rc"); $(head -c 300 "$T/four.err"))" [ "$(cat "$T/four.rc")" = 0 ]
	for f in partition lose-reply kill pause; do
		nf=$(faults_of "$f" "$T/four.out" | wc -l)
		check "four kinds: $f injected ($nf)" [ "$nf" -ge 1 ]
		check "four kinds: $f counted in faults_by_kind" grep -Eq "\"$f\":\\{\"injected\":[1-9]" "$T/four.out"
	done
	finish
fi

# The store that grants every request: a test build of dlock with one more
# store (tests/cli/broken_store.c); check's fault proxy routes to its host,
# where nothing listens, so that the network faults are carried out and
# counted though no traffic flows.
DLOCK_BROKEN=${DLOCK_BROKEN:?set DLOCK_BROKEN to the dlock_broken program}
BROKEN=broken://127.0.0.1:9

expect_rc 64 "unknown fault" "$DLOCK" check --faults nap
check "names the bad fault" grep -q "unknown fault 'nap'" "$T/err"
expect_rc 64 "bad --fencing" "$DLOCK" check --fencing maybe
expect_rc 64 "bad --clients" "$DLOCK" check --clients 0
expect_rc 64 "positional argument" "$DLOCK" check extra
expect_rc 64 "restart without a server script" "$DLOCK" check --faults restart
check "says what restart needs" grep -q -- "--server-script" "$T/err"
expect_rc 69 "unreachable store" "$DLOCK" --store "postgres://u:p@127.0.0.1:1/x?connect_timeout=1s" check --duration 1s
expect_rc 0 "--help" "$DLOCK" check --help
check "help lists the faults" grep -q "pause, kill, restart, member" "$T/out"
for f in partition lose-reply delay server-pause file-delete member-restart failover; do
	check "help names $f" grep -q -- "$f" "$T/out"
done
# The issue's list on SQLite: the kinds it cannot take are named, with why.
expect_rc 64 "partition on a file store" "$DLOCK" check --faults partition,lose-reply,kill,pause --duration 5s
check "says why partition and lose-reply are not available" \
	grep -q -- "--faults partition,lose-reply: not available on this store" "$T/err"
# Kinds that cannot each run once in --duration: refused before the run,
# each named, with the time one of each takes.
expect_rc 64 "four kinds in 3 s" "$DLOCK" --store "sqlite://$T/fit.db" check --clients 3 --duration 3s \
	--ttl 300ms --hold 40ms --faults kill,pause,file-delete,kill-tool --seed 1
check "says the kinds do not fit" grep -q -- \
	"--faults pause,kill,file-delete,kill-tool: not every kind can run in --duration 3.0s: one of each takes [0-9.]*s" "$T/err"
check "says how long to run" grep -q "give --duration [0-9.]*s or more" "$T/err"
check "no run was made" [ ! -s "$T/out" ]
expect_rc 64 "the tool itself has no broken store" "$DLOCK" --store "$BROKEN" check --duration 1s
check "says the scheme is unknown" grep -q "unknown store scheme 'broken:'" "$T/err"
expect_rc 64 "file-delete on the broken store" "$DLOCK_BROKEN" --store "$BROKEN" check --faults file-delete
check "says file-delete needs sqlite" grep -q "needs an sqlite store" "$T/err"
expect_rc 64 "member-restart without a server script" "$DLOCK" check --faults member-restart
expect_rc 64 "failover with a script that has no kill-master" "$DLOCK" check --faults failover \
	--server-script "$(dirname "$0")/../servers/memcached.sh" --server-dir "$T"
check "says failover needs kill-master" grep -q "kill-master" "$T/err"
expect_rc 64 "server-pause with no server in DIR" "$DLOCK" check --faults server-pause \
	--server-script "$(dirname "$0")/../servers/memcached.sh" --server-dir "$T"
check "says server-pause is not available" grep -q "server-pause: not available" "$T/err"
expect_rc 64 "bad --delay" "$DLOCK" check --delay soon
check "help hides the test-only store" bash -c "! grep -q broken '$T/out'"

# The runs below are independent (each its own SQLite file) and mostly
# asleep, so they run at the same time: the whole test takes ~4 s.
O=(--json check --clients 3 --ttl 300ms --hold 40ms)
# bg NAME ARGS...: run dlock check on its own store in the background;
# output in $T/NAME.out, exit code in $T/NAME.rc.
bg() {
	local n=$1; shift
	( "$DLOCK" --store "sqlite://$T/$n.db" "${O[@]}" "$@" >"$T/$n.out" 2>"$T/$n.err"; echo $? >"$T/$n.rc" ) &
}
# use NAME WANT-RC DESC: make NAME's output the current one ($T/out), check its exit code.
use() {
	cp "$T/$1.out" "$T/out"
	local rc; rc=$(cat "$T/$1.rc")
	if [ "$rc" = "$2" ]; then ok; else fail "$3: exit $rc, want $2; stderr: $(head -c 400 "$T/$1.err")"; fi
}
# Runs with faults last 4 s, as long as the longest: eight runs of three
# workers share the machine, and on a loaded one a 2.5-3 s run had room for
# no pause, no kill or one file deletion only (a requested kind that never
# ran makes the run incomplete).
bg clean --duration 1500ms --seed 7
bg pon --duration 4s --faults pause --seed 11
bg poff --duration 4s --faults pause --fencing off --seed 11
bg s1 --duration 4s --faults pause,kill --seed 5
bg s2 --duration 4s --faults pause,kill --seed 5
bg kill --duration 4s --faults kill --seed 3
# Deleting the database under a holder: the others open the store again (as
# processes started afterwards would) and make a new file. The holder must
# learn that its lock is gone (at its next renewal: holds of 150 ms see one)
# and rejoin; a store that keeps granting on the deleted file runs two
# worlds side by side, each with its own holder, until the run ends.
bg fdel --duration 4s --hold 150ms --faults file-delete --fault-every 900ms --seed 4
( "$DLOCK_BROKEN" --store "$BROKEN" "${O[@]}" --clients 2 --duration 3s --faults partition,lose-reply,delay \
	--fault-every 500ms --pause 300ms --seed 6 >"$T/bnet.out" 2>"$T/bnet.err"; echo $? >"$T/bnet.rc" ) &
wait

# In text, with a report (after the runs above, whose timing they would
# disturb): pause with fencing off on SQLite (excused
# overlaps and real stale writes), and the four kinds of the issue on the
# broken store (real overlaps from the start, excused ones after the pause).
( "$DLOCK" --store "sqlite://$T/ptext.db" check --clients 3 --ttl 300ms --hold 40ms --duration 3s \
	--faults pause --fencing off --seed 11 --report "$T/ptext.html" >"$T/ptext.out" 2>"$T/ptext.err"
  echo $? >"$T/ptext.rc" ) &
( "$DLOCK_BROKEN" --store "$BROKEN" check --clients 3 --ttl 300ms --hold 40ms --duration 6.5s \
	--faults partition,lose-reply,kill,pause --fencing off --seed 1 --report "$T/b4.html" >"$T/b4.out" 2>"$T/b4.err"
  echo $? >"$T/b4.rc" ) &
wait

# order_ok NAME: in NAME's text output, the violation lines (after the
# property table) list every real one before the excused heading, and every
# "overlap after pause" line after it; in its report, the same split.
vlines() { grep -E '^  (OVERLAP|FENCE ORDER|STALE WRITE|LOST UPDATES|NOT RUN|overlap after pause|excused)' "$T/$1.out"; }
for n in ptext b4; do
	use "$n" 1 "$n: text run with a report"
	vlines "$n" >"$T/$n.v"
	first=$(head -1 "$T/$n.v")
	check "$n: a real violation comes first ($first)" grep -Eq '^  (OVERLAP|STALE WRITE|LOST UPDATES|FENCE ORDER):' <<<"$first"
	hl=$(grep -n '^  excused, not violations: [0-9]* overlaps after a pause: the lease ran out while its holder was stopped' "$T/$n.v" | cut -d: -f1)
	check "$n: the excused overlaps have a heading that says why (line ${hl:-none})" [ -n "$hl" ]
	lastreal=$(grep -nE '^  (OVERLAP|FENCE ORDER|STALE WRITE|LOST UPDATES|NOT RUN):' "$T/$n.v" | tail -1 | cut -d: -f1)
	firstex=$(grep -n '^  overlap after pause:' "$T/$n.v" | head -1 | cut -d: -f1)
	check "$n: real lines (last at ${lastreal:-none}) before the heading (${hl:-none})" [ "${lastreal:-0}" -gt 0 -a "${lastreal:-0}" -lt "${hl:-0}" ]
	check "$n: excused lines (first at ${firstex:-none}) under the heading" [ "${firstex:-0}" -gt "${hl:-99999}" ]
	R=$T/$n.html
	sed -n '/<ul id="violation-lines">/,/<\/ul>/p' "$R" >"$T/$n.vl"
	sed -n '/<ul id="excused-lines">/,/<\/ul>/p' "$R" >"$T/$n.el"
	check "$n: report: real violations listed" grep -Eq '<li>(OVERLAP|STALE WRITE|LOST UPDATES)' "$T/$n.vl"
	check "$n: report: no excused line among them" bash -c "! grep -q 'overlap after pause' '$T/$n.vl'"
	check "$n: report: a heading says why they are excused" grep -q '<h2 id="excused">Excused, not violations: [0-9]* overlaps after a pause</h2>' "$R"
	check "$n: report: excused lines in their own list" grep -q '<li>overlap after pause: ' "$T/$n.el"
	vpos=$(grep -bo '<ul id="violation-lines">' "$R" | cut -d: -f1)
	epos=$(grep -bo '<ul id="excused-lines">' "$R" | cut -d: -f1)
	check "$n: report: violations ($vpos) before the excused ($epos)" [ "${vpos:-99999999}" -lt "${epos:-0}" ]
	# Every hold bar shows its fence: a label per bar, and the label is the bar's fence.
	bars=$(grep -o 'class="hold"' "$R" | wc -l)
	labels=$(grep -o 'class="fence"' "$R" | wc -l)
	check "$n: report: a fence label on every bar ($labels labels, $bars bars)" [ "$bars" -gt 0 -a "$labels" -eq "$bars" ]
	check "$n: report: every bar has its data-fence" [ "$(grep -Eo 'class="hold" data-fence="[0-9]+"' "$R" | wc -l)" -eq "$bars" ]
	check "$n: report: the labels are the bars' fences" python3 - "$R" <<'PY'
import re, sys
svg = open(sys.argv[1]).read()
bars = re.findall(r'class="hold" data-fence="(\d+)"', svg)
labels = re.findall(r'class="fence"[^>]*>(\d+)</text>', svg)
assert bars == labels, (len(bars), len(labels))
PY
done
# The four kinds of the issue all ran on the broken store, counted per kind.
kl=$(grep '^  faults injected by kind:' "$T/b4.out")
for f in pause kill partition lose-reply; do
	check "b4: $f injected at least once ($kl)" grep -Eq " $f [1-9]" <<<"$kl"
done
check "b4: nothing left not run" bash -c "! grep -q 'NOT RUN' '$T/b4.out'"

# No faults: every grant exclusive, the register exact.
use clean 0 "clean run"
g=$(jfield grants)
check "clean run: grants happened ($g)" [ "${g:-0}" -gt 5 ]
check "clean run: final value = accepted writes" [ "$(jfield final_value)" = "$(jfield accepted)" ]
check "clean run: no overlaps" [ "$(jfield overlaps)" = 0 ]
check "clean run: verdict pass" [ "$(jfield verdict)" = pass ]

# Pause, fencing on: the lease runs out under the stopped holder (overlaps
# that no lease can prevent), but its late write is refused: still safe.
use pon 0 "pause, fencing on"
check "pause/on: a pause happened" grep -q '"kind":"pause","worker":[0-9]' "$T/out"
check "pause/on: overlaps after the pause ($(jfield overlaps_after_pause))" [ "$(jfield overlaps_after_pause)" -gt 0 ]
check "pause/on: no store overlaps" [ "$(jfield overlaps)" = 0 ]
check "pause/on: stale write refused ($(jfield refused))" [ "$(jfield refused)" -gt 0 ]
check "pause/on: zero stale writes accepted" [ "$(jfield stale_writes_accepted)" = 0 ]
check "pause/on: zero lost updates" [ "$(jfield lost_updates)" = 0 ]

# Pause, fencing off: the paused holder wakes and writes: corruption, exit 1.
use poff 1 "pause, fencing off"
check "pause/off: stale write accepted ($(jfield stale_writes_accepted))" [ "$(jfield stale_writes_accepted)" -gt 0 ]
check "pause/off: lost update ($(jfield lost_updates))" [ "$(jfield lost_updates)" -gt 0 ]
check "pause/off: verdict fail" [ "$(jfield verdict)" = fail ]
check "pause/off: the stale write is listed" grep -q '"kind":"stale_write"' "$T/out"

# The same seed gives the same fault schedule (kinds in order). 4 s: room
# for both kinds (a requested kind that never ran makes the run incomplete).
use s1 0 "seed 5, first run"
use s2 0 "seed 5, second run"
# (the first two: how many more fit depends on how long each took)
k1=$(grep -o '"kind":"[a-z]*","worker"' "$T/s1.out" | head -2 | tr '\n' ' ')
k2=$(grep -o '"kind":"[a-z]*","worker"' "$T/s2.out" | head -2 | tr '\n' ' ')
check "seed 5 gives faults ($k1)" [ -n "$k1" ]
check "seed 5 repeats its schedule ($k1 / $k2)" [ "$k1" = "$k2" ]

# Kill: the holder dies; a new worker takes its slot; the lock comes back
# within about a TTL (300 ms) of the kill.
use kill 0 "kill"
check "kill: a holder was killed" grep -q '"kind":"kill","worker":[0-9]*,"member":-1,"start_ms":[0-9.]*,"end_ms":[0-9.]*,"ok":true' "$T/out"
heal=$(grep -o '"kind":"kill"[^}]*"heal_to_grant_ms":[0-9.-]*' "$T/out" | head -1 | sed 's/.*://')
check "kill: next grant within 1.5 s of the kill ($heal ms)" awk -v h="${heal:--1}" 'BEGIN { exit !(h >= 0 && h < 1500) }'
check "kill: no lost updates" [ "$(jfield lost_updates)" = 0 ]

# file-delete: carried out (the file existed each time), grants after each,
# and any overlap it causes ends within 500 ms (ttl 300 ms + a renewal).
use fdel "$(cat "$T/fdel.rc")" "file-delete"
nf=$(faults_of file-delete "$T/out" | wc -l)
check "file-delete: injected at least twice ($nf)" [ "$nf" -ge 2 ]
heals=$(faults_of file-delete "$T/out" | fvals heal_to_grant_ms | tr '\n' ' ')
check "file-delete: a grant after each ($heals)" awk -v h="$heals" \
	'BEGIN { n = split(h, a, " "); for (i = 1; i <= n; i++) if (a[i] < 0) exit 1; exit !(n > 0) }'
splits=$(faults_of file-delete "$T/out" | fvals split_ms | tr '\n' ' ')
check "file-delete: no two holders past 500 ms after a deletion (split ms: $splits; overlaps $(jfield overlaps))" \
	awk -v h="$splits" 'BEGIN { n = split(h, a, " "); for (i = 1; i <= n; i++) if (a[i] > 500) exit 1; exit 0 }'
check "file-delete: zero stale writes accepted" [ "$(jfield stale_writes_accepted)" = 0 ]

# The network faults never excuse an overlap: the broken store fails under them.
use bnet 1 "broken store under network faults"
nf=$(grep -Eo '"kind":"(partition|lose-reply|delay)",[^}]*"ok":true' "$T/out" | wc -l)
check "broken/net: network faults injected ($nf)" [ "$nf" -ge 2 ]
check "broken/net: overlaps counted as the store's ($(jfield overlaps))" [ "$(jfield overlaps)" -gt 0 ]
check "broken/net: none excused as after a pause" [ "$(jfield overlaps_after_pause)" = 0 ]
check "broken/net: verdict fail" [ "$(jfield verdict)" = fail ]

# Text output names both holds of a violation; the broken store is caught.
expect_rc 1 "broken store" "$DLOCK_BROKEN" --store "$BROKEN" check --clients 2 --duration 600ms --hold 40ms
check "broken: overlap reported with two holds" grep -Eq '^  OVERLAP: worker [0-9]+ hold [0-9]+ \(fence [0-9]+.*\) and worker [0-9]+ hold [0-9]+ \(fence' "$T/out"
check "broken: FAIL verdict" grep -q '^verdict: FAIL' "$T/out"
check "broken: overlap count > 0" grep -Eq 'overlapping holds \(store at fault\) +[1-9]' "$T/out"
expect_rc 1 "broken store, json" "$DLOCK_BROKEN" --store "$BROKEN" --json check --clients 2 --duration 600ms --hold 40ms --fencing off
check "broken/json: overlaps > 0" [ "$(jfield overlaps)" -gt 0 ]
check "broken/json: violation pair" grep -q '"kind":"overlap","a":{"worker":[0-9]*,"fence":[0-9]*' "$T/out"

# SIGTERM mid-run (a worker may be stopped by a pause right then): results so
# far, exit 130, and no worker left behind, stopped or running.
"$DLOCK" --store "sqlite://$T/int.db" check --duration 30s --ttl 300ms --hold 40ms \
	--faults pause --fault-every 500ms --pause 5s --seed 1 >"$T/int.out" 2>"$T/int.err" &
ipid=$!
for _ in $(seq 1 100); do grep -q '^T' <(ps --ppid "$ipid" -o stat= 2>/dev/null) && break; sleep 0.05; done
check "interrupt: a worker was paused" bash -c "ps --ppid $ipid -o stat= | grep -q '^T'"
kids=$(ps --ppid "$ipid" -o pid= | tr '\n' ' ')
kill -TERM "$ipid"
wait "$ipid"
irc=$?
check "interrupt: exit 130 ($irc)" [ "$irc" -eq 130 ]
check "interrupt: results printed" grep -q '^verdict: ' "$T/int.out"
left=0; for k in $kids; do kill -0 "$k" 2>/dev/null && left=1; done
check "interrupt: no worker left ($kids)" [ "$left" = 0 ]

# --work-dir keeps the event log and the register for a look afterwards.
expect_rc 0 "work dir" "$DLOCK" --store "sqlite://$T/w.db" check --duration 500ms --ttl 300ms --hold 40ms --work-dir "$T/wd"
check "work dir: the log has grants" grep -q '^A ' "$T/wd/log"
check "work dir: the register is kept" [ -s "$T/wd/register" ]

# Nothing left behind: the lock is free afterwards.
expect_rc 0 "status" "$DLOCK" --json --store "sqlite://$T/kill.db" status
check "no lock left held" grep -q '"locks":\[\]' "$T/out"
finish
