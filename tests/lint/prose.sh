#!/usr/bin/env bash
# A library-internal name used as a word of a sentence in a comment ("the
# dlock__zk_watcher sees", "can dlock__my_run the same SQL"): what a mechanical
# rename leaves behind. A comment names a function with its parentheses
# (dlock__pg_run()); after an article, a modal or "to", a dlock__ name without
# them is taken for a rename's casualty.
#   prose.sh SOURCE_DIR
src=${1:?usage: prose.sh SOURCE_DIR}
cd "$src" || exit 2
words='can|may|might|still|will|must|should|would|re-|to|a|an|the|its|our|their|and|or|someone|nobody'
hits=$(grep -rnE "(/\*|^\s*\*|//).*\b($words) ?dlock__[a-z0-9_]+([^a-z0-9_(]|$)" src include)
if [ -n "$hits" ]; then
	echo "dlock__ names inside sentences (write the word, or name the function with ()):" >&2
	echo "$hits" >&2
	exit 1
fi
echo "no dlock__ name inside a sentence in src/ and include/"
