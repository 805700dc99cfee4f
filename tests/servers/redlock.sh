#!/usr/bin/env bash
# Five independent redis-server masters for the redlock store (see redis.sh):
#   redlock.sh start DIR    writes DIR/uri = redlock://127.0.0.1:P1,...,127.0.0.1:P5
#   redlock.sh stop|kill|restart|pause|resume DIR [I]
# REDLOCK_MASTERS overrides the count; REDIS_PERSIST=1 turns on fsync'd AOF.
here=$(dirname "$0")
if [ "${1:-}" = start ]; then
	exec bash "$here/redis.sh" start "$2" "${REDLOCK_MASTERS:-5}"
fi
exec bash "$here/redis.sh" "$@"
