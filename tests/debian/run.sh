#!/usr/bin/env bash
# The Debian packages (debian/): `dpkg-buildpackage -us -uc -b` on a copy of
# the source tree, lintian without an error, then the packages installed on
# this machine (root: CI runs as root) and used as a packager's user would:
# a program built with `pkg-config dlock` and one with find_package(dlock)
# run on the embedded store; the tool from /usr/bin, linking no store client
# library (SQLite is part of libdlock), loads the Redis module of dlock-store-redis; man 3 pages and the
# completions are where man and the shells look. The packages are purged
# again at the end (also when a check fails).
set -euo pipefail
src=$1 cc=${2:-cc}
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "installing the packages needs root (CI runs as root)"
for t in dpkg-buildpackage dh lintian; do
	command -v "$t" >/dev/null || fail "$t missing (apt-get install dpkg-dev debhelper lintian; scripts/packages/core.test)"
done
pkgs="libdlock0 libdlock-dev dlock dlock-bench-floor dlock-store-redis dlock-store-etcd dlock-store-zookeeper"
pkgs+=" dlock-store-postgres dlock-store-mysql dlock-store-memcached"
# One run at a time on this machine (two build trees' suites may both run
# it); a run killed on its timeout (no EXIT trap) leaves its marker, and
# the next run purges what that one installed before checking.
exec 9>/var/lock/dlock-install-debian.lock
flock 9
marker=/var/lib/dlock-install-debian.installed
if [ -f "$marker" ]; then
	# shellcheck disable=SC2046
	dpkg --purge $(cat "$marker") >/dev/null 2>&1 || true
	rm -f "$marker"
fi
for p in $pkgs; do
	! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
		fail "package $p is already installed here: this test would replace it"
done
tmp=$(mktemp -d)
cleanup() {
	if [ -f "$marker" ]; then
		# shellcheck disable=SC2086
		dpkg --purge $pkgs >/dev/null 2>&1 || true
		rm -f "$marker"
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# the tree as a clone has it: the tracked files and the new ones, no build dirs
mkdir "$tmp/src"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
	git -C "$src" ls-files -co --exclude-standard -z | (cd "$src" && tar --null -cf - -T -) | tar -xf - -C "$tmp/src"
else
	(cd "$src" && tar --exclude='./build*' -cf - .) | tar -xf - -C "$tmp/src"
fi
# one job: the rest of the suite keeps the other core
(cd "$tmp/src" && DEB_BUILD_OPTIONS="parallel=1" dpkg-buildpackage -us -uc -b >"$tmp/build.log" 2>&1) ||
	{ tail -40 "$tmp/build.log"; fail "dpkg-buildpackage failed"; }
ls "$tmp"/*.deb
for p in $pkgs; do
	[ -f "$tmp/${p}_"*"_$(dpkg --print-architecture).deb" ] || fail "no package $p built"
done
lintian --fail-on error "$tmp"/*.changes >"$tmp/lintian.log" 2>&1 ||
	{ cat "$tmp/lintian.log"; fail "lintian reports errors"; }
echo "lintian: $(grep -c '^E:' "$tmp/lintian.log" || true) errors, $(grep -c '^W:' "$tmp/lintian.log" || true) warnings"

echo "$pkgs" >"$marker"
# shellcheck disable=SC2046
dpkg -i $(for p in $pkgs; do ls "$tmp/${p}_"*.deb; done) >"$tmp/dpkg.log" 2>&1 ||
	{ cat "$tmp/dpkg.log"; fail "the packages do not install"; }
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
dpkg -L libdlock0 | grep -q "/usr/lib/$multiarch/libdlock.so.0" || fail "libdlock0 lacks libdlock.so.0"
[ -f "/usr/lib/$multiarch/dlock/store-redis.so" ] || fail "dlock-store-redis lacks its module"

export DLOCK_HOME="$tmp/home"
fence_of() { sed -n "s/^holding 'examples\/hello' with fence \([0-9]*\) .*/\1/p" <<<"$1"; }
# shellcheck disable=SC2046
"$cc" -o "$tmp/hello" "$src/examples/hello.c" $(pkg-config --cflags --libs dlock)
ldd "$tmp/hello" | grep -qE "=> (/usr)?/lib/$multiarch/libdlock.so.0 " || fail "hello is not linked with the installed libdlock"
out=$("$tmp/hello")
echo "pkg-config: $out"
f1=$(fence_of "$out")
[ -n "$f1" ] || fail "hello did not hold the lock"
cmake -S "$src/tests/install" -B "$tmp/consumer" -DCMAKE_C_COMPILER="$cc" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
out=$("$tmp/consumer/hello")
echo "find_package: $out"
f2=$(fence_of "$out")
[ -n "$f2" ] && [ "$f2" -gt "$f1" ] || fail "fence did not grow ($f1, $f2)"

[ "$(command -v dlock)" = /usr/bin/dlock ] || fail "dlock is not /usr/bin/dlock: $(command -v dlock)"
libs=$(ldd /usr/bin/dlock)
if grep -qE 'hiredis|libssl|libpq|mariadb|zookeeper|curl|memcached|json-c' <<<"$libs"; then
	fail "the packaged tool links a client library: $libs"
fi
set +e
out=$(dlock --store redis://127.0.0.1:1 status 2>&1)
rc=$?
set -e
echo "dlock, redis module, no server: $rc $out"
[ "$rc" = 69 ] && grep -q "cannot connect to redis" <<<"$out" || fail "the packaged redis module did not load"
man -w dlock_acquire >/dev/null || fail "man 3 dlock_acquire not found"
man -w 1 dlock >/dev/null || fail "man 1 dlock not found"
[ -s /usr/share/bash-completion/completions/dlock ] || fail "no bash completion"
out=$(bash -c '. /usr/share/bash-completion/completions/dlock; COMP_LINE="dlock sta"; COMP_POINT=9
	COMP_WORDS=(dlock sta); COMP_CWORD=1; _dlock; echo "${COMPREPLY[*]}"')
[ "$out" = status ] || fail "the installed bash completion gives '$out' for 'dlock sta'"
[ -s /usr/share/zsh/vendor-completions/_dlock ] || fail "no zsh completion"
ls /usr/share/doc/dlock/api.md* /usr/share/doc/dlock/stores/redis.md* >/dev/null || fail "no guides in /usr/share/doc/dlock (dh_compress gzips the long ones)"
echo "installed and used: $pkgs"
