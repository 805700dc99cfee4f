#!/usr/bin/env bash
# Every C file of the tree is as .clang-format lays it out (clang-format 19):
# a change that is not says where, and `clang-format-19 -i FILE` fixes it.
#   format.sh SOURCE_DIR CLANG_FORMAT
src=${1:?usage: format.sh SOURCE_DIR CLANG_FORMAT}
cf=${2:-}
if [ -z "$cf" ] || ! [ -x "$cf" ]; then
	echo "clang-format-19 not found (scripts/install-deps test installs it)" >&2
	exit 1
fi
cd "$src" || exit 2
mapfile -t files < <(find src include tests examples bench bindings -name '*.[ch]' | sort)
if ! "$cf" --dry-run --Werror "${files[@]}" 2>"${TMPDIR:-/tmp}/format.$$"; then
	grep -E '^[^ ].*: (error|warning):' "${TMPDIR:-/tmp}/format.$$" | sed 's/: .*//' | sort -u | head -40 >&2
	echo "these files differ from .clang-format's layout: clang-format-19 -i FILE" >&2
	rm -f "${TMPDIR:-/tmp}/format.$$"
	exit 1
fi
rm -f "${TMPDIR:-/tmp}/format.$$"
echo "${#files[@]} C files laid out as .clang-format says"
