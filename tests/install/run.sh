#!/usr/bin/env bash
# Install the build into a temp prefix, then build examples/hello.c against it
# twice: with find_package(dlock) and with pkg-config dlock; run both.
set -euo pipefail
build=$1 src=$2 cc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/install" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_COMPILER="$cc" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
export DLOCK_HOME="$tmp/home" LD_LIBRARY_PATH="$tmp/prefix/lib:$tmp/prefix/lib64:${LD_LIBRARY_PATH:-}"
out=$("$tmp/consumer/hello")
echo "find_package: $out"
# fences grow from run to run (a new SQLite counter starts at the clock)
fence_of() { sed -n "s/^holding 'examples\/hello' with fence \([0-9]*\) .*/\1/p" <<<"$1"; }
f1=$(fence_of "$out")
[ -n "$f1" ]
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -1)
PKG_CONFIG_PATH="$libdir" "$cc" -o "$tmp/hello-pc" "$src/examples/hello.c" $(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs dlock) ${EXTRA_LDFLAGS:-}
out=$("$tmp/hello-pc")
echo "pkg-config: $out"
f2=$(fence_of "$out")
[ -n "$f2" ] && [ "$f2" -gt "$f1" ] || { echo "FAIL: fence did not grow ($f1, $f2)"; exit 1; }
# dlock.pc finds its prefix from where it lies, for this LIBDIR and for a
# multiarch one (lib/x86_64-linux-gnu: Debian's LIBDIR under /usr)
inc=$(PKG_CONFIG_PATH="$libdir" pkg-config --variable=includedir dlock)
[ "$(realpath "$inc")" = "$(realpath "$tmp/prefix/include")" ] || { echo "FAIL: dlock.pc's includedir is $inc"; exit 1; }
lib=$(PKG_CONFIG_PATH="$libdir" pkg-config --variable=libdir dlock)
[ "$(realpath "$lib")" = "$(realpath "$libdir/..")" ] || { echo "FAIL: dlock.pc's libdir is $lib"; exit 1; }
cmake -S "$src" -B "$tmp/multiarch" -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu -DDLOCK_BUILD_CLI=OFF >/dev/null
mkdir -p "$tmp/ma/lib/x86_64-linux-gnu/pkgconfig" "$tmp/ma/include"
cp "$tmp/multiarch/dlock.pc" "$tmp/ma/lib/x86_64-linux-gnu/pkgconfig/"
inc=$(PKG_CONFIG_PATH="$tmp/ma/lib/x86_64-linux-gnu/pkgconfig" pkg-config --variable=includedir dlock)
[ "$(realpath "$inc")" = "$(realpath "$tmp/ma/include")" ] || { echo "FAIL: a multiarch dlock.pc's includedir is $inc"; exit 1; }
# dlock.pc keeps the client libraries' own flags private, and links statically
cflags=$(PKG_CONFIG_PATH="$libdir" pkg-config --cflags dlock)
echo "cflags: $cflags"
if grep -qE -- '-D_FILE_OFFSET_BITS|hiredis|postgresql|mariadb|json-c' <<<"$cflags"; then
	echo "FAIL: dlock.pc hands its client libraries' flags to its users"
	exit 1
fi
static_libs=$(PKG_CONFIG_PATH="$libdir" pkg-config --static --libs dlock | sed 's/-ldlock/-l:libdlock.a/')
"$cc" -o "$tmp/hello-static" "$src/examples/hello.c" $cflags $static_libs ${EXTRA_LDFLAGS:-}
if ldd "$tmp/hello-static" | grep -q 'libdlock\.so'; then
	echo "FAIL: the static link still needs libdlock.so"
	exit 1
fi
out=$("$tmp/hello-static")
echo "static: $out"
f3=$(fence_of "$out")
[ -n "$f3" ] && [ "$f3" -gt "$f2" ] || { echo "FAIL: fence did not grow ($f2, $f3)"; exit 1; }
test -f "$tmp/home/dlock.db"
test "$(stat -c %a "$tmp/home/dlock.db")" = 600
# Documentation: a man 3 page for every function the installed headers
# export and for the dlock(3) overview, each rendered by man without a
# warning; the guides under share/doc/dlock; the completions of the tool.
man3="$tmp/prefix/share/man/man3"
funcs=$(cat "$tmp/prefix/include/dlock/"*.h "$tmp/prefix/include/dlock/sys/"*.h | tr '\n' ' ' |
	grep -oE 'DLOCK_EXTERN[^;(]*\bdlock[a-z0-9_]*[[:space:]]*\(' | grep -oE 'dlock[a-z0-9_]*[[:space:]]*\($' | tr -d ' (')
[ "$(wc -w <<<"$funcs")" -gt 40 ] || { echo "FAIL: exported functions not found in the headers: $funcs"; exit 1; }
for f in dlock $funcs; do
	[ -s "$man3/$f.3" ] || { echo "FAIL: no man page $man3/$f.3"; exit 1; }
done
for f in "$man3"/*.3; do
	warn=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$f" 2>&1 >/dev/null)
	[ -z "$warn" ] || { echo "FAIL: man warns on $f: $warn"; exit 1; }
done
LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$man3/dlock_acquire.3" | grep -q 'DLOCK_ELOCKED (wait 0' ||
	{ echo "FAIL: dlock_acquire(3) lacks its return values"; exit 1; }
echo "man 3: $(ls "$man3" | wc -l) pages"
for f in README.md api.md cli.md stores/redis.md examples/hello.c; do
	[ -s "$tmp/prefix/share/doc/dlock/$f" ] || { echo "FAIL: share/doc/dlock/$f not installed"; exit 1; }
done
if [ -x "$tmp/prefix/bin/dlock" ]; then
	[ -s "$tmp/prefix/share/bash-completion/completions/dlock" ] || { echo "FAIL: no bash completion"; exit 1; }
	[ -s "$tmp/prefix/share/zsh/vendor-completions/_dlock" ] || { echo "FAIL: no zsh completion"; exit 1; }
fi
# The tool links libdlock alone (no store client library), finds the libdlock
# of its own prefix, and loads a store's module from LIBDIR/dlock on the first
# use of its scheme: an unreachable server is "unavailable" (69), not "not
# installed". Without the module it names the file and the package.
unset DLOCK_MODULE_DIR
modules=$(ls -d "$tmp"/prefix/lib*/dlock 2>/dev/null | head -1 || true)
if [ -x "$tmp/prefix/bin/dlock" ] && [ -f "$modules/store-redis.so" ]; then
	echo "modules: $(cd "$modules" && echo store-*.so)"
	libs=$(env -u LD_LIBRARY_PATH ldd "$tmp/prefix/bin/dlock")
	if ! grep -qE "$tmp/prefix/(bin/\.\./)?lib[^ ]*/libdlock.so" <<<"$libs"; then
		echo "FAIL: the installed tool does not find its own libdlock: $libs"
		exit 1
	fi
	if grep -qE 'hiredis|libssl|libpq|mariadb|zookeeper|curl|memcached|json-c' <<<"$libs"; then
		echo "FAIL: the installed tool links a store client library: $libs"
		exit 1
	fi
	set +e
	out=$(env -u LD_LIBRARY_PATH DLOCK_HOME="$tmp/home" "$tmp/prefix/bin/dlock" --store redis://127.0.0.1:1 status 2>&1)
	rc=$?
	set -e
	echo "redis module, no server: $rc $out"
	if [ "$rc" != 69 ] || ! grep -q "cannot connect to redis" <<<"$out"; then
		echo "FAIL: the redis module did not load from the prefix"
		exit 1
	fi
	mv "$modules/store-redis.so" "$modules/store-redis.so.off"
	set +e
	out=$(env -u LD_LIBRARY_PATH DLOCK_HOME="$tmp/home" "$tmp/prefix/bin/dlock" --store redis://127.0.0.1:1 status 2>&1)
	set -e
	echo "redis module gone: $out"
	if ! grep -q "redis store is not installed.*store-redis.so, which is missing" <<<"$out"; then
		echo "FAIL: a missing module is not named"
		exit 1
	fi
fi
