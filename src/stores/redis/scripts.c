/*
 * The Lua scripts of the Redis and Redlock stores, embedded at build time
 * from the files in lua/ (cmake/embed.cmake). Their contracts: redis.h.
 */
#include "redis.h"
#include "redis_lua.h"

/* clang-format off */
const char *const dlock__rscript_text[DLOCK__RS_COUNT] = {
	[DLOCK__RS_ACQUIRE] = DLOCK__LUA_ACQUIRE,
	[DLOCK__RS_RELEASE] = DLOCK__LUA_RELEASE,
	[DLOCK__RS_RENEW] = DLOCK__LUA_RENEW,
	[DLOCK__RS_CANCEL] = DLOCK__LUA_CANCEL,
	[DLOCK__RS_STATUS] = DLOCK__LUA_STATUS,
	[DLOCK__RS_RAISE] = DLOCK__LUA_RAISE,
};
/* clang-format on */
