#!/bin/bash
# Shell completion (completion/dlock.bash, and zsh's completion/_dlock that
# runs it through bashcompinit): commands, each command's options as its
# --help lists them, every URI scheme the stores register and every fault
# kind of `dlock check`, and COMMAND of `run` completed as a command. zsh
# missing is a failure (scripts/packages/cli.test).
. "$(dirname "$0")/lib.sh" "$@"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
COMP="$SRC/completion/dlock.bash"
PATH="$(dirname "$DLOCK"):$PATH"
[ "$(basename "$DLOCK")" = dlock ] || ln -sf "$DLOCK" "$T/dlock" && PATH="$T:$PATH"

# comp WORD...: the completions of the last word, one line, sorted. As
# bash calls the function: COMP_LINE and COMP_POINT, and COMP_WORDS split
# at COMP_WORDBREAKS too (':' and '=' end words there).
comp() {
	bash -c '. "$1"; shift; COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
		COMP_WORDBREAKS=$'"'"' \t\n"\'"'"'><=;|&(:'"'"'
		read -ra COMP_WORDS <<<"$(sed "s/\([:=]\)/ \1 /g" <<<"$COMP_LINE")"
		[[ $COMP_LINE == *" " ]] && COMP_WORDS+=("")
		COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _dlock
		printf "%s\n" "${COMPREPLY[@]}" | sort -u | tr "\n" " "' _ "$COMP" "$@"
}
has() { grep -qw -- "$2" <<<" $1 "; }

out=$(comp dlock sta)
check "a command: sta -> status ($out)" [ "$out" = "status " ]
out=$(comp dlock '')
for c in run acquire extend release status break demo check bench; do
	check "commands offer $c" has "$out" "$c"
done
# each command's options are those its --help lists
for c in run acquire status check bench; do
	want=$("$DLOCK" "$c" --help | sed -nE 's/^ {1,4}(-[a-zA-Z], )?(--[a-z][a-z-]*).*/\2/p' | sort -u | tr '\n' ' ')
	out=$(comp dlock --store "sqlite://$T/x.db" "$c" --)
	check "options of $c = its --help ($out)" [ "$out" = "$want" -a -n "$want" ]
done
out=$(comp dlock run --n)
check "run --n -> --no-wait ($out)" [ "$out" = "--no-wait " ]
# words bash splits at ':' and '=' are still one word each
out=$(comp dlock --store "sqlite://$T/x.db" sta)
check "after --store sqlite://FILE: sta -> status ($out)" [ "$out" = "status " ]
out=$(comp dlock --store "sqlite://$T/x.db" run --ttl=5s job ech)
check "after --ttl=5s: run NAME ech -> echo ($out)" has "$out" echo
out=$(comp dlock --store redis:)
check "--store redis: -> the rest of redis:// after the colon ($out)" [ "$out" = "// " ]
# every scheme in src/stores/schemes.h
out=$(comp dlock --store '')
for s in $(grep -o 'X("[a-z+]*"' "$SRC/src/stores/schemes.h" | cut -d'"' -f2); do
	check "--store offers $s://" has "$out" "$s://"
done
# every fault kind `dlock check` names in its unknown-fault error
kinds=$("$DLOCK" --store "sqlite://$T/x.db" check --faults nosuchfault 2>&1 | sed -n "s/.*unknown fault '[^']*' (\([^)]*\)).*/\1/p" | tr -d ',')
check "check's fault kinds read ($kinds)" [ -n "$kinds" ]
for k in $kinds; do
	out=$(comp dlock check --faults "pause,${k:0:3}")
	check "--faults pause,${k:0:3} offers pause,$k" has "$out" "pause,$k"
done
# run NAME COMMAND: COMMAND is a command, its arguments files
out=$(comp dlock run --ttl 5s job ech)
check "run NAME ech -> echo ($out)" has "$out" echo
out=$(comp dlock run job -- ech)
check "run NAME -- ech -> echo ($out)" has "$out" echo
touch "$T/afile.txt"
out=$(comp dlock run job ls "$T/afi")
check "run NAME ls FILE -> the file ($out)" [ "$out" = "$T/afile.txt " ]
out=$(comp dlock run --hold job --t)
check "run --hold NAME --t -> --ttl ($out)" [ "$out" = "--ttl " ]

# zsh: _dlock runs the same logic through bashcompinit
ZSH=$(command -v zsh || true)
check "zsh installed" [ -n "$ZSH" ]
# laid out as installed: share/zsh/vendor-completions/_dlock finds
# share/bash-completion/completions/dlock from its own place
mkdir -p "$T/share/zsh/vendor-completions" "$T/share/bash-completion/completions"
cp "$SRC/completion/_dlock" "$T/share/zsh/vendor-completions/"
cp "$COMP" "$T/share/bash-completion/completions/dlock"
zcomp() {
	# _dlock's first run (outside a completion widget its own completing
	# fails) sources the bash logic and registers it for dlock
	"$ZSH" -f -c 'fpath=("$1" $fpath); autoload -Uz compinit && compinit -u -D; autoload -Uz _dlock
		_dlock >/dev/null 2>&1; shift 2
		local -a m; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
		m=(${(f)"$(compgen -F _dlock -- ${@[-1]})"}); m=(${(M)m:#${@[-1]}*})
		print -r -- "${_comps[dlock]}|${(j: :)${(u)${(o)m}}}"' _ "$T/share/zsh/vendor-completions" "$COMP" "$@" 2>&1
}
out=$(zcomp dlock sta)
check "zsh: dlock completes through _dlock ($out)" [ "${out%%|*}" = "_bash_complete -F _dlock" ]
check "zsh: sta -> status ($out)" [ "${out#*|}" = status ]
out=$(zcomp dlock --store x run --no)
check "zsh: run --no -> --no-wait ($out)" [ "${out#*|}" = --no-wait ]
out=$(zcomp dlock check --faults pause,lo)
check "zsh: --faults pause,lo -> pause,lose-reply ($out)" [ "${out#*|}" = pause,lose-reply ]
finish
