# bash completion for dlock(1), also zsh's (completion/_dlock runs it through
# bashcompinit). Installed as share/bash-completion/completions/dlock; the options of each command are
# read from `dlock COMMAND --help`, so they follow the installed tool.

_dlock_options() {
	"${1:-dlock}" "$2" --help 2>/dev/null |
		sed -nE 's/^ {1,4}(-[a-zA-Z], )?(--[a-z][a-z-]*).*/\2/p'
}

# COMPREPLY from the lines on stdin (zsh's bashcompinit has no mapfile)
_dlock_reply() {
	local line
	COMPREPLY=()
	while IFS= read -r line; do
		COMPREPLY+=("$line")
	done
}

# The words up to the cursor in _dlock_w, the current one's index in
# _dlock_cw. bash splits COMP_WORDS at ':' and '=' too (COMP_WORDBREAKS):
# `--store sqlite:///x.db` would be three words, so the line is split at
# blanks again; zsh's bashcompinit hands whole words.
_dlock_words() {
	if [ -n "${ZSH_VERSION:-}" ]; then
		_dlock_w=("${COMP_WORDS[@]}")
		_dlock_cw=$COMP_CWORD
		return
	fi
	local line=${COMP_LINE:0:COMP_POINT} IFS=$' \t\n'
	read -ra _dlock_w <<<"$line"
	[[ -z $line || $line == *[[:space:]] ]] && _dlock_w+=("")
	_dlock_cw=$((${#_dlock_w[@]} - 1))
}

_dlock() {
	local -a _dlock_w
	local _dlock_cw
	_dlock_words
	_dlock_complete
	# bash replaces only what follows the current word's last ':' (when
	# COMP_WORDBREAKS has it, as by default): drop that part of each
	local cur=${_dlock_w[_dlock_cw]} pre i
	if [ -z "${ZSH_VERSION:-}" ] && [[ $COMP_WORDBREAKS == *:* && $cur == *:* ]]; then
		pre=${cur%"${cur##*:}"}
		for i in "${!COMPREPLY[@]}"; do
			COMPREPLY[i]=${COMPREPLY[i]#"$pre"}
		done
	fi
}

_dlock_complete() {
	local cur=${_dlock_w[_dlock_cw]} prev=${_dlock_w[_dlock_cw - 1]}
	local tool=${_dlock_w[0]} cmd= i w name_seen=0 start=
	local commands="run acquire extend release status break demo check bench"
	# the command, and where COMMAND of `run` starts (after '--', or the
	# first word after the lock name that is not an option)
	for ((i = 1; i < _dlock_cw; i++)); do
		w=${_dlock_w[i]}
		case $w in
		--store | --ttl | --wait | --permits | --conflict-exit-code | -c | --command | --kill-after | \
			--holder | --clients | --duration | --hold | --faults | --ops | --replica | --master | \
			--fault-every | --pause | --delay | --fencing | --seed | --name | --server-script | \
			--server-dir | --report | --work-dir | --locks | --think | --workload)
			# options with a value (--hold of run takes none: it is a flag there)
			[ "$cmd" = run ] && [ "$w" = --hold ] || ((i++))
			continue
			;;
		--)
			if [ "$cmd" = run ] && [ $name_seen = 1 ]; then
				start=$((i + 1))
				break
			fi
			continue
			;;
		-*) continue ;;
		esac
		if [ -z "$cmd" ]; then
			cmd=$w
		elif [ "$cmd" = run ]; then
			if [ $name_seen = 1 ]; then
				start=$i
				break
			fi
			name_seen=1
		fi
	done
	if [ -z "$start" ] && [ "$cmd" = run ] && [ $name_seen = 1 ] && [[ $cur != -* ]]; then
		start=$_dlock_cw
	fi
	if [ -n "$start" ]; then
		# COMMAND, then its arguments as files
		if [ "$start" -eq "$_dlock_cw" ]; then
			_dlock_reply < <(compgen -c -- "$cur" | sort -u)
		else
			compopt -o filenames 2>/dev/null
			_dlock_reply < <(compgen -f -- "$cur")
		fi
		return
	fi
	case $prev in
	--store)
		_dlock_reply < <(compgen -W "sqlite:// redis:// rediss:// redis+sentinel:// redis+cluster://
			rediss+cluster:// redlock:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql://
			mariadb:// memcached://" -- "$cur")
		compopt -o nospace 2>/dev/null
		return
		;;
	--report | --work-dir | --server-dir | --server-script)
		compopt -o filenames 2>/dev/null
		_dlock_reply < <(compgen -f -- "$cur")
		return
		;;
	--fencing)
		_dlock_reply < <(compgen -W "on off" -- "$cur")
		return
		;;
	--faults)
		local kinds="pause kill restart member partition lose-reply delay server-pause file-delete
			member-restart failover kill-tool session-kill evict failback" pre=
		[[ $cur == *,* ]] && pre=${cur%,*},
		_dlock_reply < <(compgen -P "$pre" -W "$kinds" -- "${cur##*,}")
		compopt -o nospace 2>/dev/null
		return
		;;
	esac
	if [ -z "$cmd" ]; then
		if [[ $cur == -* ]]; then
			_dlock_reply < <(compgen -W "--store --json --quiet --verbose --help --version" -- "$cur")
		else
			_dlock_reply < <(compgen -W "$commands" -- "$cur")
		fi
		return
	fi
	if [[ $cur == -* ]]; then
		_dlock_reply < <(compgen -W "$(_dlock_options "$tool" "$cmd")" -- "$cur")
	fi
}
complete -F _dlock dlock
