#!/bin/bash
# `dlock demo` (the README's main job): stale-token failures without the
# lock, none with it, a one-line verdict, in under 15 seconds.
. "$(dirname "$0")/lib.sh" "$@"

t0=$(now_ms)
expect_rc 0 "dlock demo" "$DLOCK" demo
t=$(( $(now_ms) - t0 ))
cat "$T/out"
check "demo took under 15 s ($t ms)" [ "$t" -lt 15000 ]
un=$(sed -n 's/^ *without a lock: *\([0-9]*\) of.*/\1/p' "$T/out")
lk=$(sed -n 's/^ *with dlock: *\([0-9]*\) of.*/\1/p' "$T/out")
check "prints the unlocked count ($un)" [ -n "$un" ]
check "prints the locked count ($lk)" [ -n "$lk" ]
check "failures without the lock ($un)" [ "${un:-0}" -gt 0 ]
check "no failures with the lock ($lk)" [ "${lk:-1}" -eq 0 ]
check "one-line verdict" [ "$(grep -c '^verdict: ' "$T/out")" -eq 1 ]
check "used the default store (DLOCK_HOME)" grep -q "$DLOCK_HOME/dlock.db" "$T/out"

# --json for machines; the same story.
expect_rc 0 "dlock --json demo" "$DLOCK" --json demo
check "json verdict pass" grep -q '"verdict":"pass"' "$T/out"
check "json locked rejected 0" grep -q '"locked":{"rejected":0,' "$T/out"
check "json unlocked rejected > 0" grep -Eq '"unlocked":\{"rejected":[1-9]' "$T/out"

# --store works too, and the demo leaves no lock behind.
expect_rc 0 "demo on an explicit store" "$DLOCK" -q --store "sqlite://$T/explicit.db" demo
check "-q still prints the verdict" grep -q '^verdict: ' "$T/out"
expect_rc 0 "status of the explicit store" "$DLOCK" --json --store "sqlite://$T/explicit.db" status
check "no lock left behind" grep -q '"locks":\[\]' "$T/out"
finish
