#!/bin/bash
# The holder process that `dlock acquire` leaves behind on stores whose locks
# die with their session (ZooKeeper, MySQL get_lock, PostgreSQL advisory).
# DLOCK_TEST_HOLDER=1 runs that path on the embedded store; with
# CLI_TEST_URI_FILE (see lib.sh) it runs on a real session-bound store
# (PostgreSQL mode=advisory, MySQL mode=get_lock). The same contract
# as every other store — held until release, or until the TTL passes without
# an extend; only the right handle acts on it.
. "$(dirname "$0")/lib.sh" "$@"
export DLOCK_TEST_HOLDER=1

# alive PID: the process exists and is not a zombie.
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$s" ] && [ "${s#Z}" = "$s" ]; }

t0=$(now_ms)
H=$("$DLOCK" acquire --ttl 20s held)
rc=$?
t=$(( $(now_ms) - t0 ))
check "acquire exits 0 (got $rc)" [ "$rc" -eq 0 ]
check "\$(dlock acquire) returns at once: the holder keeps no stdout open (${t} ms)" [ "$t" -lt 5000 ]
check "holder handle ($H)" grep -q '^dlh2\.' <<<"$H"

"$DLOCK" --json status held >"$T/st"
pid=$(json_num pid "$T/st")
check "status shows a holder process ($pid)" [ -n "$pid" ]
check "the holder process is alive" alive "$pid"
check "the holder is its own session" [ "$(ps -o sid= -p "$pid" | tr -d ' ')" = "$pid" ]
expect_rc 75 "held: --no-wait" "$DLOCK" acquire --no-wait held

# (15 s, below the 20 s acquired: ZooKeeper refuses a lease longer than the
# session timeout it chose from the first TTL.)
expect_rc 0 "extend --ttl 15s" "$DLOCK" extend --ttl 15s held "$H"
H2=$(cat "$T/out")
check "extend prints a holder handle" grep -q '^dlh2\.' "$T/out"
expect_rc 0 "extend --json" "$DLOCK" --json extend held "$H2"
check "extend --json" grep -Eq '^\{"name":"held","handle":"dlh2[^"]+","fence":[0-9]+,"ttl_ms":15000\}$' "$T/out"

# Wrong handles change nothing.
expect_rc 1 "wrong secret" "$DLOCK" release held "${H2%?????}00000"
expect_rc 1 "right handle, wrong name" "$DLOCK" release other "$H2"
expect_rc 1 "extend with a wrong secret" "$DLOCK" extend held "${H2%?????}00000"
expect_rc 64 "malformed holder handle" "$DLOCK" release held "dlh1.garbage"
expect_rc 75 "still held after wrong handles" "$DLOCK" acquire --no-wait held
check "holder still alive" alive "$pid"

expect_rc 0 "release --json" "$DLOCK" --json release held "$H2"
check "release --json" grep -q '^{"name":"held","released":true}$' "$T/out"
for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
check "the holder process exits after release" sh -c "! ps -o stat= -p $pid | grep -qv Z"
expect_rc 1 "release again" "$DLOCK" release held "$H2"
expect_rc 0 "free after release" "$DLOCK" run --no-wait held -- true

# A hold nobody extends ends after its TTL: the holder gives the lock up.
expect_rc 0 "short hold" "$DLOCK" --json acquire --ttl 500ms brief
check "acquire --json" grep -Eq '^\{"name":"brief","handle":"dlh2[^"]+","fence":[0-9]+,"ttl_ms":[0-9]+\}$' "$T/out"
SH=$(grep -o '"handle":"[^"]*"' "$T/out" | cut -d'"' -f4)
t0=$(now_ms)

expect_rc 0 "taken once the holder gave up" env -u DLOCK_TEST_HOLDER "$DLOCK" acquire --wait 10s brief
t=$(( $(now_ms) - t0 ))
check "within a few seconds of the 500ms TTL ($t ms)" [ "$t" -lt 5000 ]
NEW=$(cat "$T/out")
expect_rc 1 "the expired holder handle cannot release" "$DLOCK" release brief "$SH"
expect_rc 0 "the new holder releases" "$DLOCK" release brief "$NEW"

# Failing acquires leave no holder behind.
expect_rc 0 "hold" env -u DLOCK_TEST_HOLDER "$DLOCK" acquire --ttl 30s busy
B=$(cat "$T/out")
# (3 s, not less: the open of the store comes out of the wait, and a
# PostgreSQL connect under an ASan build on a loaded machine took over 300 ms.)
expect_rc 75 "--wait 3s on a held lock" "$DLOCK" acquire --wait 3s busy
expect_rc 0 "release" "$DLOCK" release busy "$B"
# The holder's argv never carries the store URI (every local user reads
# /proc/PID/cmdline): not even when the password was on our command line.
if [ -n "${DLOCK_STORE:-}" ]; then
	pw=$(sed -n 's|^[a-z+]*://[^:/@]*:\([^@/]*\)@.*|\1|p' <<<"$DLOCK_STORE")
	expect_rc 0 "acquire --store URI" env -u DLOCK_STORE "$DLOCK" --store "$DLOCK_STORE" acquire --ttl 20s argv
	A=$(cat "$T/out")
	apid=$(cut -d. -f6 <<<"$A")
	check "holder pid in the handle ($A)" alive "$apid"
	check "the holder's argv is only 'dlock --lock-holder-process'" \
		[ "$(tr '\0' ' ' </proc/"$apid"/cmdline)" = "dlock --lock-holder-process " ]
	if [ -n "$pw" ]; then
		check "no password in the holder's cmdline or environment" \
			sh -c "! grep -qF -- '$pw' /proc/$apid/cmdline /proc/$apid/environ"
	fi
	expect_rc 0 "release" "$DLOCK" release argv "$A"
fi

# dlock break on a holder process's hold: through the store's release where
# the store can free another connection's hold; PostgreSQL advisory and MySQL
# get_lock locks belong to the holder's connection: 69, and the hold stays.
expect_rc 0 "acquire to break" "$DLOCK" acquire --ttl 20s tobreak
BH=$(cat "$T/out")
"$DLOCK" --json status tobreak >"$T/st"
bid=$(grep -o '"id":"[0-9a-f]*"' "$T/st" | head -1 | cut -d'"' -f4)
case "${DLOCK_STORE:-}" in
*mode=advisory* | *mode=get_lock*)
	expect_rc 69 "break --holder on a connection-bound store" "$DLOCK" break --holder "$bid" tobreak
	check "  says why" grep -q "cannot free a hold of another connection" "$T/err"
	expect_rc 0 "  the hold stays; its handle releases" "$DLOCK" release tobreak "$BH"
	;;
*)
	expect_rc 0 "break --holder $bid" "$DLOCK" break --holder "$bid" tobreak
	expect_rc 0 "free after break" env -u DLOCK_TEST_HOLDER "$DLOCK" acquire --no-wait --ttl 5s tobreak
	NB=$(cat "$T/out")
	expect_rc 1 "the broken handle releases nothing" "$DLOCK" release tobreak "$BH"
	expect_rc 0 "the new holder releases" "$DLOCK" release tobreak "$NB"
	;;
esac

"$DLOCK" --json status held brief busy >"$T/st"
check "no lock left" [ "$(grep -o '"holders":\[\]' "$T/st" | wc -l)" -eq 3 ]
finish
