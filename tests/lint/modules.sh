#!/usr/bin/env bash
# The store modules use libdlock's public API alone, and the tool loads no
# store client library until a URI names its store.
#   modules.sh BUILD_DIR TOOL
set -euo pipefail
build=$1 tool=$2
lib=$build/libdlock.so
exports=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
n=0
for m in "$build"/dlock/store-*.so; do
	[ -e "$m" ] || continue
	n=$((n + 1))
	imports=$(nm -D --undefined-only "$m" | awk '{print $2}' | grep '^dlock' | sort -u || true)
	if grep -q '^dlock__' <<<"$imports"; then
		echo "FAIL: $m imports private names: $(grep '^dlock__' <<<"$imports" | tr '\n' ' ')"
		exit 1
	fi
	missing=$(comm -23 <(echo "$imports") <(echo "$exports") | grep . || true)
	if [ -n "$missing" ]; then
		echo "FAIL: $m imports what libdlock does not export: $missing"
		exit 1
	fi
	echo "ok: $(basename "$m"): $(wc -l <<<"$imports") names, all public"
done
[ "$n" -gt 0 ] || { echo "FAIL: no store module in $build/dlock"; exit 1; }
libs=$(ldd "$tool")
if grep -E 'hiredis|libssl|libpq|mariadb|zookeeper|curl|memcached|json-c' <<<"$libs"; then
	echo "FAIL: the tool links a store client library"
	exit 1
fi
echo "ok: the tool links $(grep -c '=>' <<<"$libs") libraries, no store client library"
