#!/usr/bin/env bash
# dlock (etcd://...?recipe=concurrency) and `etcdctl lock` (etcd's own
# concurrency.Mutex) on one lock, on the etcd suite's server:
#  1. mutual exclusion both ways under contention: `etcdctl lock P/job CMD`
#     and `dlock run job -- CMD` increment one counter file with a
#     read-pause-write at the same time; the count ends exact;
#  2. a holder of either kind killed (SIGKILL) -> the other gets the lock
#     once the dead holder's lease ends;
#  3. an unknown recipe is a usage error;
#  4. waits wake without polling on both sides: counted at the server.
#   etcd_etcdctl.sh DLOCK URI_FILE
set -u
dlock=${1:?dlock binary}
base=$(cat "${2:?uri file}")
ep=${base#etcd://}
ep=${ep%%/*}
ep=${ep%%\?*}
command -v etcdctl >/dev/null || { echo "FAIL: etcdctl missing (etcd-client)"; exit 1; }
export ETCDCTL_API=3
work=$(mktemp -d /tmp/dlock-etcdctl-XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do pkill -9 -P "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
. "$(dirname "$0")/peer_lib.sh"
ctl() { etcdctl --endpoints="$ep" "$@"; }
pfx=locks$$/app                        # a prefix with a '/', as etcdctl users name locks
uri="$base?prefix=$pfx&recipe=concurrency&ttl=3s"
lockname=$pfx/job                      # what etcdctl calls the same lock
incr='v=$(cat "$1"); sleep 0.005; echo $((v + 1)) >"$1"'

# 1. a shared counter, both sides at once
echo 0 >"$work/count"
n=25
(
	for ((i = 0; i < n; i++)); do
		ctl lock --ttl=3 "$lockname" -- sh -c "$incr" sh "$work/count" >/dev/null || echo "etcdctl lock $i exited $?"
	done
) >"$work/ctl.out" 2>&1 &
cp=$!
pids+=($cp)
for ((i = 0; i < n; i++)); do
	"$dlock" run --store "$uri" --wait 60s job -- sh -c "$incr" sh "$work/count" || fail "dlock run $i exited $?"
done
wait "$cp"
[ -s "$work/ctl.out" ] && { fail "etcdctl side failed"; cat "$work/ctl.out"; }
got=$(cat "$work/count")
echo "counter: $got after $n etcdctl + $n dlock increments"
[ "$got" = $((2 * n)) ] || fail "counter is $got, want $((2 * n)) (an update was lost: no exclusion)"

# 2a. an etcdctl holder killed: dlock gets the lock once its lease (3 s) ends
ctl lock --ttl=3 "$lockname" -- sh -c 'echo held >"$1"; exec sleep 600' sh "$work/ctl.held" >/dev/null 2>&1 &
hp=$!
pids+=($hp)
wait_line "$work/ctl.held" held 30 || fail "etcdctl holder did not say held"
"$dlock" run --store "$uri" --no-wait job -- true
rc=$?
[ $rc = 75 ] || fail "dlock took a lock etcdctl holds (exit $rc, want 75)"
pkill -9 -P "$hp"
kill -9 "$hp"
t0=$(date +%s%N)
"$dlock" run --store "$uri" --wait 30s job -- true || fail "dlock did not get the lock after the etcdctl holder died"
echo "after the etcdctl holder was killed, dlock got the lock in $(( ($(date +%s%N) - t0) / 1000000 )) ms"

# 2b. a dlock holder killed: etcdctl gets the lock once its lease (3 s) ends
"$dlock" run --store "$uri" job -- sh -c 'echo held >"$1"; exec sleep 600' sh "$work/dl.held" &
dp=$!
pids+=($dp)
wait_line "$work/dl.held" held 30 || fail "dlock holder did not start"
timeout 2 etcdctl --endpoints="$ep" lock --ttl=3 "$lockname" true >/dev/null 2>&1
rc=$?
[ $rc = 124 ] || fail "etcdctl took a lock dlock holds (exit $rc, want 124 from timeout)"
pkill -9 -P "$dp"
kill -9 "$dp"
t0=$(date +%s%N)
timeout 30 etcdctl --endpoints="$ep" lock --ttl=3 "$lockname" true >/dev/null ||
	fail "etcdctl did not get the lock after the dlock holder died"
echo "after the dlock holder was killed, etcdctl got the lock in $(( ($(date +%s%N) - t0) / 1000000 )) ms"

# 4. waits wake without polling, both sides, shown by counting the server's
#    Range and Txn requests (etcd's /metrics) while a waiter waits 3 s: a
#    dlock waiter sends only its heartbeat, a try every third of the TTL
#    (1 s here) that keeps its queue key alive — up to 4 tries of at most 4
#    requests (Txn, Range, the re-read when the watch started at a later
#    revision) in the window: 16 — where a poller retrying every 100 ms
#    would send 60 or more; it is woken by its watch. etcdctl's waiter
#    watches and sends nothing; the dlock holder it waits behind renews
#    every second (up to 12 requests allowed).
kv_requests() {
	python3 - "$ep" <<'PY'
import sys, urllib.request
n = 0
for l in urllib.request.urlopen("http://%s/metrics" % sys.argv[1], timeout=5).read().decode().splitlines():
    if l.startswith("grpc_server_handled_total") and ('"Range"' in l or '"Txn"' in l):
        n += float(l.split()[-1])
print(int(n))
PY
}
# the waiter has queued: a second key under the lock's prefix (both
# recipes keep one key per contender there)
queued() {
	[ "$(ctl get --prefix "$lockname/" --keys-only 2>/dev/null | grep -c .)" -ge 2 ]
}
hold_until='echo held >"$1"; while [ ! -e "$2" ]; do sleep 0.02; done'
ctl lock --ttl=3 "$lockname" -- sh -c "$hold_until" sh "$work/h4a" "$work/r4a" >/dev/null 2>&1 &
pids+=($!)
"$dlock" run --store "$uri" --wait 30s job -- sh -c 'echo got >"$1"' sh "$work/g4a" &
pids+=($!)
waits_quietly kv_requests 16 "Range/Txn requests" 10 "dlock behind etcdctl" "$work/h4a" "$work/r4a" "$work/g4a" queued
"$dlock" run --store "$uri" job -- sh -c "$hold_until" sh "$work/h4b" "$work/r4b" &
pids+=($!)
wait_line "$work/h4b" held 30
ctl lock --ttl=3 "$lockname" -- sh -c 'echo got >"$1"' sh "$work/g4b" >/dev/null 2>&1 &
pids+=($!)
waits_quietly kv_requests 12 "Range/Txn requests" 10 "etcdctl behind dlock" "$work/h4b" "$work/r4b" "$work/g4b" queued
wait

# 3. refusals
"$dlock" run --store "$base?recipe=zookeeper" --no-wait x -- true 2>"$work/e1"
rc=$?
[ $rc = 64 ] || fail "unknown recipe: exit $rc, want 64: $(cat "$work/e1")"

[ $fails = 0 ] && echo "etcd.etcdctl: all checks passed" || echo "etcd.etcdctl: $fails check(s) FAILED"
[ $fails = 0 ]
