#!/bin/bash
# 12 concurrent `dlock run --wait 60s` each read a counter file, sleep, and
# write it back plus one: the file ends at exactly 12, and every child saw a
# distinct DLOCK_FENCE, increasing in the order the children ran.
. "$(dirname "$0")/lib.sh" "$@"

N=12
echo 0 >"$T/counter"
: >"$T/fences"
start=$(now_ms)
pids=
for i in $(seq 1 $N); do
	"$DLOCK" run --wait 60s counter -- sh -c '
		n=$(cat "$0"); sleep 0.2; echo $((n + 1)) >"$0"
		echo "$DLOCK_NAME $DLOCK_FENCE" >>"$1"' "$T/counter" "$T/fences" 2>"$T/err.$i" &
	pids="$pids $!"
done
rcs=0 codes=
for p in $pids; do wait "$p"; rc=$?; codes="$codes $rc"; [ $rc -eq 0 ] || rcs=$((rcs + 1)); done
echo "12 runs took $(( $(now_ms) - start )) ms"

check "every dlock run exited 0 (exit codes:$codes; stderr: $(cat "$T"/err.* | head -c 600))" [ "$rcs" -eq 0 ]
check "counter is exactly $N (got $(cat "$T/counter"))" [ "$(cat "$T/counter")" = "$N" ]
check "$N fences recorded" [ "$(wc -l <"$T/fences")" -eq $N ]
check "DLOCK_NAME set in every child" [ "$(grep -c '^counter ' "$T/fences")" -eq $N ]
check "fences are distinct" [ "$(cut -d' ' -f2 "$T/fences" | sort -u | wc -l)" -eq $N ]
# The file is appended in the order the children held the lock.
check "fences increase in run order: $(cut -d' ' -f2 "$T/fences" | tr '\n' ' ')" \
	sh -c "cut -d' ' -f2 '$T/fences' | sort -n -c"
check "fences are positive" sh -c "! cut -d' ' -f2 '$T/fences' | grep -qx 0"

# The lock is free afterwards.
expect_rc 0 "no-wait after all runs" "$DLOCK" run --no-wait counter -- true
finish
