# Shared helpers for the CLI tests: sourced, not run.
# Usage in a test: . "$(dirname "$0")/lib.sh" "$@"   (first argument: the dlock binary)
# Every test gets its own DLOCK_HOME (so its own embedded SQLite store) in a
# temp dir that is removed at exit, and never the user's default store.
set -u

DLOCK=${1:?usage: $0 PATH/TO/dlock}
[ -x "$DLOCK" ] || { echo "not executable: $DLOCK" >&2; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dlock-cli-test.XXXXXX")
export DLOCK_HOME="$T/home"
mkdir -p "$DLOCK_HOME"
unset DLOCK_STORE DLOCK_NAME DLOCK_FENCE
# Nor a config file of this machine or user (docs/cli.md, "Choosing the
# store"): a file naming no store means the default. store_choice.sh sets its own.
export DLOCK_CONFIG=/dev/null
# A test may run against a server store: CLI_TEST_URI_FILE holds its URI
# (written by tests/servers/<kind>.sh), CLI_TEST_URI_SUFFIX adds options.
if [ -n "${CLI_TEST_URI_FILE:-}" ]; then
	DLOCK_STORE="$(cat "$CLI_TEST_URI_FILE")${CLI_TEST_URI_SUFFIX:-}" || exit 1
	export DLOCK_STORE
fi
FAILS=0
CHECKS=0

cleanup() {
	# Stop anything this test left running (its own background jobs only).
	for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT

# Create the store once before any concurrent use: the SQLite store's first
# open of a new file can fail with "create schema: database is locked" when
# several processes race to create it (reported; not what these tests test).
"$DLOCK" status >/dev/null 2>&1

fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
ok() { CHECKS=$((CHECKS + 1)); }

# check DESC COND...: run a test command, count a failure if it is false.
check() {
	local desc=$1; shift
	if "$@"; then ok; else fail "$desc"; fi
}

# expect_rc WANT DESC CMD...: run CMD, compare its exit code; output in $T/out, $T/err.
expect_rc() {
	local want=$1 desc=$2; shift 2
	"$@" >"$T/out" 2>"$T/err"
	local rc=$?
	if [ "$rc" -eq "$want" ]; then ok; else
		fail "$desc: exit $rc, want $want; stderr: $(head -c 400 "$T/err")"
	fi
	return 0
}

now_ms() { date +%s%3N; }

# The fixed cost of a `dlock run` in this run (start, open, acquire,
# release, close and exit on the store in DLOCK_STORE, or the embedded one):
# scheduling, not a bound under test. measure_sched keeps in $sched the
# slowest of five runs seen so far; call it again after each timed case, as
# the load may have changed. A bound on a whole `dlock` process adds $sched.
sched=0
measure_sched() {
	local i t t0
	for i in 1 2 3 4 5; do
		t0=$(now_ms)
		"$DLOCK" run --no-wait "sched-base$i" -- true >/dev/null 2>&1
		t=$(( $(now_ms) - t0 ))
		[ "$t" -gt "$sched" ] && sched=$t
	done
	echo "measured: fixed cost of a dlock run, so far $sched ms"
}

# json_num KEY FILE: the first numeric value of "KEY": in FILE.
json_num() { grep -o "\"$1\":[0-9-]*" "$2" | head -1 | cut -d: -f2; }

finish() {
	if [ "$FAILS" -ne 0 ]; then
		echo "$FAILS of $((CHECKS + FAILS)) checks failed" >&2
		exit 1
	fi
	echo "all $CHECKS checks passed"
	exit 0
}
