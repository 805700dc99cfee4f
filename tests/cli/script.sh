#!/bin/bash
# acquire -> status shows the holder -> extend -> release, as a shell script
# uses them; a wrong handle exits 1 and leaves the lock held; --json forms.
. "$(dirname "$0")/lib.sh" "$@"

# acquire prints exactly one line: the handle.
expect_rc 0 "acquire" "$DLOCK" acquire --ttl 5s deploy/prod
check "acquire prints one line" [ "$(wc -l <"$T/out")" -eq 1 ]
H=$(cat "$T/out")
check "handle is not empty" [ -n "$H" ]

# status shows the holder: name, mode, host, pid, fence, TTL left.
expect_rc 0 "status (table)" "$DLOCK" status
check "table has a header" grep -q "^NAME" "$T/out"
check "table shows the lock" grep -q "^deploy/prod  *exclusive" "$T/out"
check "table shows the host" grep -q "$(hostname)" "$T/out"
expect_rc 0 "status --json" "$DLOCK" --json status deploy/prod
check "json names the lock" grep -q '"name":"deploy/prod"' "$T/out"
check "json has one holder" [ "$(grep -o '"id":' "$T/out" | wc -l)" -eq 1 ]
check "json holder has the host" grep -q "\"host\":\"$(hostname)\"" "$T/out"
check "json holder has a pid" grep -Eq '"pid":[1-9][0-9]*' "$T/out"
check "json holder is exclusive" grep -q '"mode":"exclusive"' "$T/out"
fence=$(json_num fence "$T/out")
check "json has a fence ($fence)" [ "${fence:-0}" -ge 1 ]
ttl=$(json_num ttl_left_ms "$T/out")
check "TTL left is within the 5s lease ($ttl)" test "${ttl:-0}" -gt 0 -a "${ttl:-0}" -le 5000

# Nobody else gets it while it is held.
expect_rc 75 "held: another acquire --no-wait" "$DLOCK" acquire --no-wait deploy/prod

# extend pushes the lease out and prints the handle to use from now on.
expect_rc 0 "extend --ttl 60s" "$DLOCK" extend --ttl 60s deploy/prod "$H"
H2=$(cat "$T/out")
check "extend prints a handle" [ -n "$H2" ]
"$DLOCK" --json status deploy/prod >"$T/st"
ttl=$(json_num ttl_left_ms "$T/st")
check "TTL left grew past the old 5s lease ($ttl)" test "${ttl:-0}" -gt 5000
check "extend kept the fence" [ "$(json_num fence "$T/st")" = "$fence" ]

# A wrong handle: a real handle, but of an earlier hold of the same name.
expect_rc 0 "acquire other" "$DLOCK" acquire --ttl 30s other
OLD=$(cat "$T/out")
expect_rc 0 "release other" "$DLOCK" release other "$OLD"
expect_rc 0 "re-acquire other" "$DLOCK" acquire --ttl 30s other
CUR=$(cat "$T/out")
expect_rc 1 "release with a stale handle" "$DLOCK" release other "$OLD"
check "says not held" grep -q "not held" "$T/err"
expect_rc 1 "extend with a stale handle" "$DLOCK" extend other "$OLD"
expect_rc 1 "release another lock's handle" "$DLOCK" release other "$H2"
expect_rc 75 "the lock stays held after wrong handles" "$DLOCK" acquire --no-wait other
"$DLOCK" --json status other >"$T/st"
check "still one holder" [ "$(grep -o '"id":' "$T/st" | wc -l)" -eq 1 ]
expect_rc 0 "release with the right handle" "$DLOCK" release other "$CUR"
expect_rc 1 "release twice" "$DLOCK" release other "$CUR"

# release frees it.
expect_rc 0 "release" "$DLOCK" release deploy/prod "$H2"
expect_rc 0 "status after release" "$DLOCK" --json status deploy/prod
check "no holder after release" grep -q '"holders":\[\]' "$T/out"
expect_rc 0 "free again" "$DLOCK" run --no-wait deploy/prod -- true

# --json forms.
expect_rc 0 "acquire --json" "$DLOCK" --json acquire --ttl 30s j
check "acquire --json has name, handle, fence, ttl_ms" \
	grep -Eq '^\{"name":"j","handle":"[^"]+","fence":[0-9]+,"ttl_ms":[0-9]+\}$' "$T/out"
JH=$(grep -o '"handle":"[^"]*"' "$T/out" | cut -d'"' -f4)
expect_rc 0 "extend --json" "$DLOCK" extend --json j "$JH"
check "extend --json" grep -Eq '^\{"name":"j","handle":"[^"]+","fence":[0-9]+,"ttl_ms":[0-9]+\}$' "$T/out"
expect_rc 0 "release --json" "$DLOCK" release j "$JH" --json
check "release --json" grep -q '^{"name":"j","released":true}$' "$T/out"

# Shared and semaphore holds from scripts: no need to repeat --shared/--permits.
expect_rc 0 "shared 1" "$DLOCK" acquire --shared --ttl 30s rw
S1=$(cat "$T/out")
expect_rc 0 "shared 2" "$DLOCK" acquire --shared --ttl 30s rw
S2=$(cat "$T/out")
expect_rc 75 "exclusive vs shared" "$DLOCK" acquire --no-wait rw
"$DLOCK" --json status rw >"$T/st"
check "two shared holders" [ "$(grep -o '"mode":"shared"' "$T/st" | wc -l)" -eq 2 ]
expect_rc 0 "extend shared" "$DLOCK" extend rw "$S1"
expect_rc 0 "release shared 1" "$DLOCK" release rw "$(cat "$T/out")"
expect_rc 0 "release shared 2" "$DLOCK" release rw "$S2"
expect_rc 0 "permit 1 of 2" "$DLOCK" acquire --permits 2 --ttl 30s sem
P1=$(cat "$T/out")
expect_rc 0 "permit 2 of 2" "$DLOCK" acquire --permits 2 --ttl 30s sem
P2=$(cat "$T/out")
expect_rc 75 "no third permit" "$DLOCK" acquire --permits 2 --no-wait sem
expect_rc 0 "release permit 1" "$DLOCK" release sem "$P1"
expect_rc 0 "release permit 2" "$DLOCK" release sem "$P2"

# A hold from acquire expires by itself after its TTL when nobody extends it.
expect_rc 0 "short hold" "$DLOCK" acquire --ttl 300ms short
SH=$(cat "$T/out")
expect_rc 0 "taken once the TTL passed (waits for it)" "$DLOCK" acquire --wait 10s --ttl 30s short
NEW=$(cat "$T/out")
expect_rc 1 "the expired handle cannot release the new holder" "$DLOCK" release short "$SH"
expect_rc 1 "nor extend it" "$DLOCK" extend short "$SH"
expect_rc 0 "the new holder releases" "$DLOCK" release short "$NEW"
finish
