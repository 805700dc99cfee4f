#!/usr/bin/env bash
# dlock (zk://...?recipe=curator / curator-rw) and Apache Curator's own lock
# recipes on one lock path, on the standalone server of the zookeeper suite:
#  1. mutual exclusion both ways under contention: a Curator
#     InterProcessMutex and `dlock run` increment one counter file with a
#     read-pause-write; the count ends exact;
#  2. a holder of either kind killed (SIGKILL) -> the other gets the lock
#     once the dead holder's session expires;
#  3. read-write: Curator's read lock admits a dlock shared holder and
#     refuses a dlock exclusive one; Curator's write lock refuses both; a
#     dlock writer refuses Curator's reader;
#  4. what a recipe cannot do is refused (shared under recipe=curator,
#     semaphores), and an unknown recipe is a usage error;
#  5. waits wake without polling on both sides: counted at the server.
#   zookeeper_curator.sh DLOCK URI_FILE
set -u
dlock=${1:?dlock binary}
base=$(cat "${2:?uri file}")
hp=${base#zk://}
hp=${hp%%/*}
hp=${hp%%\?*}
jars=/usr/share/java
cp="$jars/curator-recipes.jar:$jars/curator-framework.jar:$jars/curator-client.jar:$jars/zookeeper.jar:$jars/zookeeper-jute.jar:$jars/guava.jar:$jars/slf4j-api.jar:$jars/slf4j-nop.jar"
for j in curator-recipes curator-framework curator-client guava slf4j-nop; do
	[ -e "$jars/$j.jar" ] || { echo "FAIL: $jars/$j.jar missing (libcurator-recipes-java, libslf4j-java)"; exit 1; }
done
command -v javac >/dev/null || { echo "FAIL: javac missing (default-jdk-headless)"; exit 1; }
work=$(mktemp -d /tmp/dlock-curator-XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
. "$(dirname "$0")/peer_lib.sh"
javac -nowarn -d "$work" -cp "$cp" "$(dirname "$0")/peers/CuratorPeer.java" 2>&1 | grep -v '^Note:'
peer="java -cp $cp:$work CuratorPeer $hp"  # word-split on purpose: no spaces inside
prefix=curator$$
path=/$prefix/job                      # the lock path both sides use
uri="$base?prefix=$prefix&recipe=curator&ttl=4s"
rw="$base?prefix=$prefix&recipe=curator-rw&ttl=4s"

# 1. a shared counter, both sides at once
echo 0 >"$work/count"
$peer "$path" count mutex 150 "$work/count" >"$work/java.out" 2>&1 &
jp=$!
pids+=($jp)
dl_n=30
for ((i = 0; i < dl_n; i++)); do
	"$dlock" run --store "$uri" --wait 60s job -- sh -c 'v=$(cat "$1"); sleep 0.003; echo $((v + 1)) >"$1"' sh "$work/count" ||
		fail "dlock run $i exited $?"
done
wait "$jp" || { fail "Curator counter exited $?"; cat "$work/java.out"; }
got=$(cat "$work/count")
echo "counter: $got after 150 Curator + $dl_n dlock increments"
[ "$got" = $((150 + dl_n)) ] || fail "counter is $got, want $((150 + dl_n)) (an update was lost: no exclusion)"

# 2a. a Curator holder killed: dlock gets the lock once its session expires (4 s)
$peer "$path" hold mutex >"$work/hold.out" 2>&1 &
hp1=$!
pids+=($hp1)
wait_line "$work/hold.out" held 30 || fail "Curator holder did not say held"
"$dlock" run --store "$uri" --no-wait job -- true
rc=$?
[ $rc = 75 ] || fail "dlock took a lock Curator holds (exit $rc, want 75)"
kill -9 "$hp1"
t0=$(date +%s%N)
"$dlock" run --store "$uri" --wait 30s job -- true || fail "dlock did not get the lock after the Curator holder died"
echo "after the Curator holder was killed, dlock got the lock in $(( ($(date +%s%N) - t0) / 1000000 )) ms"

# 2b. a dlock holder killed: Curator gets the lock once its session expires
"$dlock" run --store "$uri" job -- sh -c 'echo held >"$1"; exec sleep 600' sh "$work/dl.out" &
dp=$!
pids+=($dp)
wait_line "$work/dl.out" held 30 || fail "dlock holder did not start"
$peer "$path" try mutex 200
rc=$?
[ $rc = 3 ] || fail "Curator took a lock dlock holds (exit $rc, want 3)"
kill -9 "$dp"
pkill -9 -f "sleep 600" 2>/dev/null
$peer "$path" try mutex 30000 || fail "Curator did not get the lock after the dlock holder died"

# 3. read-write with Curator's InterProcessReadWriteLock
rwpath=/$prefix/rw
$peer "$rwpath" hold read >"$work/r.out" 2>&1 &
rp=$!
pids+=($rp)
wait_line "$work/r.out" held 30 || fail "Curator reader did not say held"
"$dlock" run --store "$rw" --no-wait --shared rw -- true || fail "dlock reader refused beside a Curator reader"
"$dlock" run --store "$rw" --no-wait rw -- true
rc=$?
[ $rc = 75 ] || fail "dlock writer admitted beside a Curator reader (exit $rc)"
kill -9 "$rp"
$peer "$rwpath" hold write >"$work/w.out" 2>&1 &
wp=$!
pids+=($wp)
wait_line "$work/w.out" held 30 || fail "Curator writer did not get the lock"
"$dlock" run --store "$rw" --no-wait --shared rw -- true
rc=$?
[ $rc = 75 ] || fail "dlock reader admitted beside a Curator writer (exit $rc)"
kill -9 "$wp"
"$dlock" run --store "$rw" --wait 30s rw -- sh -c 'echo held >"$1"; exec sleep 600' sh "$work/dw.out" &
dwp=$!
pids+=($dwp)
wait_line "$work/dw.out" held 30 || fail "dlock writer did not get the lock"
$peer "$rwpath" try read 200
rc=$?
[ $rc = 3 ] || fail "Curator reader admitted beside a dlock writer (exit $rc)"
kill -9 "$dwp"
pkill -9 -f "sleep 600" 2>/dev/null

# 5. waits wake without polling, both sides, shown by counting the packets
#    the server received (srvr) while a waiter waits 3 s: session pings, the
#    holder's renewals and the dlock waiter's 1 s heartbeat, not a poller's
#    hundreds; then the release wakes the waiter through its watch.
received() {
	local h=${hp%%,*} line
	exec 3<>"/dev/tcp/${h%:*}/${h##*:}" || return 1
	printf srvr >&3
	line=$(grep '^Received:' <&3)
	exec 3<&-
	echo "${line#Received: }"
}
$peer "$path" holduntil mutex "$work/r5a" >"$work/h5a" 2>&1 &
pids+=($!)
"$dlock" run --store "$uri" --wait 30s job -- sh -c 'echo got >"$1"' sh "$work/g5a" &
pids+=($!)
waits_quietly received 40 packets 20 "dlock behind Curator" "$work/h5a" "$work/r5a" "$work/g5a"
"$dlock" run --store "$uri" job -- sh -c 'echo held >"$1"; while [ ! -e "$2" ]; do sleep 0.02; done' \
	sh "$work/h5b" "$work/r5b" &
pids+=($!)
wait_line "$work/h5b" held 30
( $peer "$path" try mutex 30000 && echo got >"$work/g5b" ) >/dev/null 2>&1 &
pids+=($!)
waits_quietly received 40 packets 20 "Curator behind dlock" "$work/h5b" "$work/r5b" "$work/g5b"
wait

# 4. refusals
"$dlock" run --store "$uri" --no-wait --shared x -- true 2>"$work/e1"
rc=$?
{ [ $rc = 69 ] && grep -q 'curator-rw' "$work/e1"; } || fail "shared under recipe=curator: exit $rc, $(cat "$work/e1")"
"$dlock" run --store "$rw" --no-wait --permits 3 x -- true 2>"$work/e2"
rc=$?
{ [ $rc = 69 ] && grep -q 'semaphore' "$work/e2"; } || fail "semaphore under recipe=curator-rw: exit $rc, $(cat "$work/e2")"
"$dlock" run --store "$base?recipe=chubby" --no-wait x -- true 2>"$work/e3"
rc=$?
[ $rc = 64 ] || fail "unknown recipe: exit $rc, want 64: $(cat "$work/e3")"

[ $fails = 0 ] && echo "zookeeper.curator: all checks passed" || echo "zookeeper.curator: $fails check(s) FAILED"
[ $fails = 0 ]
