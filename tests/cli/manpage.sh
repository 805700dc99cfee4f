#!/bin/bash
# docs/dlock.1 renders without groff warnings and documents every command,
# every option the commands accept, and every exit code.
set -u
groff=$1 page=$2 dlock=$3
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
warn=$("$groff" -man -ww -z "$page" 2>&1)
[ -z "$warn" ] || fail "groff warnings: $warn"
text=$("$groff" -man -Tutf8 -P-c "$page" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g; s/.\x08//g')
for cmd in run acquire extend release status break demo check bench; do
	grep -q "dlock $cmd" <<<"$text" || fail "command $cmd not documented"
	# Every long option in the command's --help appears in the page.
	for opt in $("$dlock" "$cmd" --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
		grep -q -- "$opt" <<<"$text" || fail "option $opt of $cmd not documented"
	done
done
for scheme in sqlite redis rediss redis+sentinel redlock etcd etcds zk postgres postgresql mysql mariadb memcached; do
	grep -q "$scheme:" <<<"$text" || fail "scheme $scheme: not documented"
done
grep -q 'DESIGN.md' "$page" && fail "the page refers to a DESIGN.md the sources do not have"
for code in 0 1 64 69 75 76; do
	grep -Eq "^ *$code( |$)" <<<"$text" || fail "exit code $code not documented"
done
for env in DLOCK_STORE DLOCK_HOME DLOCK_NAME DLOCK_FENCE; do
	grep -q "$env" <<<"$text" || fail "$env not documented"
done
[ "$fails" -eq 0 ] && echo "man page ok"
exit $((fails != 0))
