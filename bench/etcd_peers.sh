#!/usr/bin/env bash
# Uncontended acquire+release on one fresh etcd member, dlock against its
# peers, measured in the same run:
#   1. etcd_bench: dlock try-acquire+release and the raw Txn+DeleteRange floor,
#      interleaved round by round;
#   2. dlock (libdlock.so through ctypes) and python3-etcd3's Lock,
#      interleaved round by round in one Python loop, so machine load hits
#      both alike (the ctypes call costs about a microsecond);
#   3. `etcdctl lock NAME true` (a process per lock, as a shell script uses it).
#
#   bench/etcd_peers.sh BUILD_DIR [ROUNDS]    (BUILD_DIR has etcd_bench and libdlock.so)
# Needs etcd-server, etcd-client, python3-etcd3 (Debian). Not a test.
set -eu
build=${1:?usage: etcd_peers.sh BUILD_DIR [ROUNDS]}
rounds=${2:-500}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/dlock-etcd-bench-XXXXXX)
trap 'bash "$here/../tests/servers/etcd.sh" stop "$dir"; rm -rf "$dir"' EXIT
bash "$here/../tests/servers/etcd.sh" start "$dir"
uri=$(cat "$dir/uri")
hp=${uri#etcd://}
echo "etcd $(etcd --version | head -1 | awk '{print $3}') at $hp; load: $(cut -d' ' -f1-3 /proc/loadavg)"
bench=$(find "$build" -name etcd_bench -type f | head -1)
"$bench" "$uri" "$rounds"

/usr/bin/python3 - "$uri" "$rounds" "$build/libdlock.so" <<'PY'
import ctypes, sys, time
import etcd3
uri, n, lib = sys.argv[1], int(sys.argv[2]), ctypes.CDLL(sys.argv[3])
lib.dlock_store_open.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
lib.dlock_lock_new.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
lib.dlock_acquire.argtypes = [ctypes.c_void_p, ctypes.c_int64]
lib.dlock_release.argtypes = [ctypes.c_void_p]
store, lock = ctypes.c_void_p(), ctypes.c_void_p()
assert lib.dlock_store_open(ctypes.byref(store), uri.encode()) == 0
assert lib.dlock_lock_new(ctypes.byref(lock), store, b"peer-dlock", None) == 0
host, port = uri[len("etcd://"):].rsplit(':', 1)
lk = etcd3.client(host=host, port=int(port)).lock('peer-python', ttl=30)
d, p = [], []
for i in range(n + 20):
    t = time.monotonic()
    if lib.dlock_acquire(lock, 0) != 0 or lib.dlock_release(lock) != 0:
        sys.exit("dlock: acquire/release failed")
    t1 = time.monotonic()
    if not lk.acquire(timeout=0):
        sys.exit("python3-etcd3: not acquired")
    lk.release()
    t2 = time.monotonic()
    if i >= 20:
        d.append((t1 - t) * 1e6)
        p.append((t2 - t1) * 1e6)
for name, v in (("dlock via ctypes (interleaved)", d), ("python3-etcd3 Lock (interleaved)", p)):
    v.sort()
    print("%-34s rounds %5d  mean %8.0f us  median %8.0f us  p99 %8.0f us"
          % (name, len(v), sum(v) / len(v), v[len(v) // 2], v[int(len(v) * 0.99)]))
PY

n=$(( rounds / 10 > 20 ? rounds / 10 : 20 ))
v=()
for i in $(seq 1 "$n"); do
	t0=$(date +%s%N)
	ETCDCTL_API=3 etcdctl --endpoints="http://$hp" lock peer-etcdctl true >/dev/null
	v+=($(( ($(date +%s%N) - t0) / 1000 )))
done
printf '%s\n' "${v[@]}" | sort -n | awk -v n="$n" '{a[NR]=$1; s+=$1}
	END {printf "%-34s rounds %5d  mean %8.0f us  median %8.0f us  p99 %8.0f us\n",
	     "etcdctl lock NAME true (process)", n, s/n, a[int(n/2)+1], a[int(n*0.99)+1]}'
