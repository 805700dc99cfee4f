/*
 * The Redis store: one server, Lua scripts for every decision (one round
 * trip per acquire/release/extend, one per renewal batch), pub/sub wake-ups
 * for waiters. Key layout and script contracts: redis_common.h and
 * docs/stores/redis.md. Also home of the code the Redlock store reuses.
 */
#include "redis_common.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#define KIND "redis"

/* ------------------------------------------------------------------------ */
/* Lua scripts                                                               */
/* ------------------------------------------------------------------------ */

/*
 * Every script takes the lock's holder key {P:NAME} as KEYS[1] and derives
 * its siblings (":f", ":w", ":q", ":x", channel ":c") by appending: they
 * share the hash tag, so they live in the same slot. Few arguments on
 * purpose: Redis pays per argument on every call, and the acquire+release
 * pair is measured against two PINGs (bench/redis_baseline.c).
 *
 * redis.replicate_commands() first: Redis 3.2-4 refuse writes after TIME
 * without it (5+ replicate effects anyway). Expiries use the server's TIME, never a
 * client clock. head() prunes dead waiters (no live registration) off the
 * fair queue and returns the live head.
 */
#define LUA_REPL "if redis.replicate_commands then redis.replicate_commands() end\n"
#define LUA_NOW                                                                      \
	"local t = redis.call('TIME')\n"                                             \
	"local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
#define LUA_HEAD                                                                     \
	"local function head()\n"                                                    \
	"  while true do\n"                                                          \
	"    local h = redis.call('ZRANGE', Q, 0, 0)[1]\n"                          \
	"    if not h then return nil end\n"                                         \
	"    local d = redis.call('ZSCORE', W, h)\n"                                 \
	"    if d and tonumber(d) > now then return h end\n"                         \
	"    redis.call('ZREM', Q, h) redis.call('ZREM', W, h) redis.call('ZREM', X, h)\n" \
	"  end\n"                                                                    \
	"end\n"

/*
 * The next fence. With ARGV[8] (the fence guard: the id of the server the
 * client talks to, sent by redis+sentinel://) fences never go back after a
 * failover that loses grants: a fence is handed out only when it is at most a
 * reservation r (key ":e") that is on the replicas. The client waits (WAIT)
 * for the replicas when a grant returns a third element (a new reservation)
 * and then confirms it (c := r); a server that has not granted since it
 * became master (its id differs from ":e"'s) first lifts the counter to r,
 * above every fence handed out before the failover. Returns f[, r].
 */
#define LUA_FENCE                                                                    \
	"local function fence()\n"                                                   \
	"  local F = H .. ':f'\n"                                                    \
	"  local id = ARGV[8]\n"                                                     \
	"  if not id or id == '' then return redis.call('INCR', F) end\n"            \
	"  local E = H .. ':e'\n"                                                    \
	"  local e = redis.call('HMGET', E, 'id', 'r', 'c')\n"                       \
	"  if e[1] ~= id then\n"                                                     \
	"    local r = tonumber(e[2] or '0')\n"                                      \
	"    if tonumber(redis.call('GET', F) or '0') < r then redis.call('SET', F, r) end\n" \
	"    redis.call('HSET', E, 'id', id)\n"                                      \
	"  end\n"                                                                    \
	"  local f = redis.call('INCR', F)\n"                                        \
	"  if f <= tonumber(e[3] or '0') then return f end\n"                        \
	"  local r = math.max(f + " DLOCK__RFENCE_BLOCK " - 1, tonumber(e[2] or '0'))\n" \
	"  redis.call('HSET', E, 'r', r)\n"                                          \
	"  return f, r\n"                                                            \
	"end\n"

/* Wake one waiter, by its owner token, on its client's own channel
 * ":c:<client id>" (only that store handle listens there); an owner of
 * another shape is told on the lock's channel. */
#define LUA_WAKE                                                                     \
	"local function wake(h)\n"                                                   \
	"  local cid = string.match(h, '^(%x+)%-')\n"                                \
	"  redis.call('PUBLISH', cid and (H .. ':c:' .. cid) or (H .. ':c'), h)\n"   \
	"end\n"

const char *const dlock__rscript_text[DLOCK__RS_COUNT] = {
	/* ARGV: owner, ttl, flags (mode 'x'|'s', fair '0'|'1', reg: '0' not
	 * waiting, '1' waiting, '2' waiting and registered by an earlier try),
	 * permits, queue ttl, "pid host", queue ticket ('' = the server's TIME in
	 * microseconds; Redlock sends one client ticket to every master so that
	 * all masters order their queues alike) */
	[DLOCK__RS_ACQUIRE] =
		"local H, owner, ttl, fl = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]\n"
		"local mode, fair, reg = string.sub(fl, 1, 1), string.sub(fl, 2, 2) == '1', string.sub(fl, 3, 3)\n"
		"local permits = tonumber(ARGV[4])\n"
		LUA_REPL LUA_NOW LUA_FENCE
		/* the common case first, with nothing else to look at: a free mutex or
		 * semaphore, not fair, no registration of ours to clean up */
		"if mode == 'x' and not fair and reg ~= '2' and redis.call('EXISTS', H) == 0 then\n"
		"  local f, r = fence()\n"
		"  redis.call('HSET', H, owner, string.format('%d %d x %d ', now + ttl, f, permits) .. ARGV[6])\n"
		"  redis.call('PEXPIRE', H, ttl)\n"
		"  return r and {1, f, r} or {1, f}\n"
		"end\n"
		"local W, Q, X = H .. ':w', H .. ':q', H .. ':x'\n"
		LUA_HEAD LUA_WAKE
		/* prune expired holders; an owner that already holds gets its grant back,
		 * its expiry refreshed to ttl from now (makes a retried acquire after a
		 * lost reply idempotent, and never shorter than the client's lease) */
		"local live, lmode, limit, soonest, latest = 0, nil, permits, nil, now\n"
		"if redis.call('EXISTS', H) == 1 then\n"
		"  local all = redis.call('HGETALL', H)\n"
		"  for i = 1, #all, 2 do\n"
		"    local k, v = all[i], all[i + 1]\n"
		"    local e, f, m, p = string.match(v, '^(%d+) (%d+) (%a) (%d+)')\n"
		"    e = tonumber(e)\n"
		"    if e <= now then redis.call('HDEL', H, k)\n"
		/* ours already (a retry after a lost reply): the lease counts from now,
		 * so the server must not expire it earlier than the client's deadline */
		"    elseif k == owner then\n"
		"      redis.call('HSET', H, owner, string.format('%d ', now + ttl) .. string.match(v, '^%d+ (.*)$'))\n"
		"      if redis.call('PTTL', H) < ttl then redis.call('PEXPIRE', H, ttl) end\n"
		/* its fence may be one whose reservation was never confirmed (the
		 * reply carrying it was lost): the client must wait for it again */
		"      local e = ARGV[8] and ARGV[8] ~= '' and redis.call('HMGET', H .. ':e', 'r', 'c')\n"
		"      if e and tonumber(f) > tonumber(e[2] or '0') then\n"
		"        return {1, tonumber(f), math.max(tonumber(f), tonumber(e[1] or '0'))}\n"
		"      end\n"
		"      return {1, tonumber(f)}\n"
		"    else\n"
		"      live, lmode, limit = live + 1, m, math.min(limit, tonumber(p))\n"
		"      if not soonest or e < soonest then soonest = e end\n"
		"      if e > latest then latest = e end\n"
		"    end\n"
		"  end\n"
		"end\n"
		"local ok, till = true, nil\n"
		"if live > 0 then\n"
		"  if mode == 's' then ok = lmode == 's'\n"
		"  elseif permits > 1 then ok = lmode == 'x' and live < math.min(limit, permits)\n"
		"  else ok = false end\n"
		"  if not ok then till = (mode == 'x' and permits > 1) and soonest or latest end\n"
		"end\n"
		/* writer preference: a live waiting writer blocks new readers */
		"if ok and mode == 's' then\n"
		"  redis.call('ZREMRANGEBYSCORE', X, '-inf', now)\n"
		"  local wr = redis.call('ZRANGE', X, 0, 0, 'WITHSCORES')\n"
		"  if wr[1] then ok = false till = tonumber(wr[2]) end\n"
		"end\n"
		"if ok and fair then\n"
		"  local h = head()\n"
		"  if h and h ~= owner then ok = false till = tonumber(redis.call('ZSCORE', W, h)) end\n"
		"end\n"
		"if ok then\n"
		"  local f, r = fence()\n"
		"  redis.call('HSET', H, owner, string.format('%d %d %s %d ', now + ttl, f, mode, permits) .. ARGV[6])\n"
		"  if live == 0 then redis.call('PEXPIRE', H, ttl)\n"
		"  elseif redis.call('PTTL', H) < ttl then redis.call('PEXPIRE', H, ttl) end\n"
		"  if reg == '2' then\n"
		"    redis.call('ZREM', W, owner) redis.call('ZREM', X, owner)\n"
		"    if fair then\n"
		"      redis.call('ZREM', Q, owner)\n"
		/* readers queued behind a reader may go too: wake the new head */
		"      if mode == 's' then local h = head() if h then wake(h) end end\n"
		"    end\n"
		"  end\n"
		"  return r and {1, f, r} or {1, f}\n"
		"end\n"
		"local qttl = tonumber(ARGV[5])\n"
		"if reg ~= '0' then\n"
		"  redis.call('ZREMRANGEBYSCORE', W, '-inf', now)\n"
		/* new, or a registration that lapsed: (re)join at the tail */
		"  if fair and not redis.call('ZSCORE', W, owner) then\n"
		"    local tk = ARGV[7] ~= '' and tonumber(ARGV[7]) or tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
		"    redis.call('ZADD', Q, tk, owner)\n"
		"  end\n"
		"  redis.call('ZADD', W, now + qttl, owner)\n"
		"  if mode == 'x' then redis.call('ZADD', X, now + qttl, owner) end\n"
		"  for _, k in ipairs({W, Q, X}) do\n"
		"    if redis.call('PTTL', k) < qttl then redis.call('PEXPIRE', k, qttl) end\n"
		"  end\n"
		"end\n"
		"return {0, math.max(1, (till or (now + qttl)) - now)}\n",

	/* ARGV: owner [, '0' = do not wake anyone (Redlock undoing a failed try)].
	 * The wake-up names the releaser after '*', so a client subscribed to
	 * several masters (Redlock) can tell one release from another. */
	[DLOCK__RS_RELEASE] =
		"local H, owner = KEYS[1], ARGV[1]\n"
		LUA_REPL LUA_WAKE
		/* Redis deletes the hash with its last field */
		"local held = redis.call('HDEL', H, owner)\n"
		/* every waiter is registered in :w (re-registered each try), so no :w, no one to wake */
		"local W = H .. ':w'\n"
		"if ARGV[2] == '0' or redis.call('EXISTS', W) == 0 then return held end\n"
		"local msg, Q, X = '*' .. owner, H .. ':q', H .. ':x'\n"
		/* Not held here but still queued: a Redlock holder this master refused
		 * (it won a quorum elsewhere). It waits no more: leave the queue, or it
		 * stays the head here and refuses the next waiter until it lapses. */
		"if held == 0 then\n"
		"  if redis.call('ZREM', W, owner) == 0 then return 0 end\n"
		"  redis.call('ZREM', Q, owner) redis.call('ZREM', X, owner)\n"
		"end\n"
		LUA_NOW
		"if redis.call('EXISTS', Q) == 1 then\n"
		LUA_HEAD
		"  local h = head()\n"
		"  if h then msg = h end\n"
		/* unfair, only writers waiting: wake one, the longest-registered live
		 * one (one winner anyway; waking all makes a herd). Readers may all go
		 * together, so they are all woken. */
		"elseif redis.call('ZCARD', W) == redis.call('ZCARD', X) then\n"
		"  local h = redis.call('ZRANGEBYSCORE', W, now, '+inf', 'LIMIT', 0, 1)[1]\n"
		"  if h then msg = h end\n"
		"end\n"
		"if string.sub(msg, 1, 1) == '*' then redis.call('PUBLISH', H .. ':c', msg) else wake(msg) end\n"
		"return held\n",

	/* KEYS: H1..Hn; ARGV: owner1, ttl1, owner2, ttl2, ... */
	[DLOCK__RS_RENEW] =
		LUA_REPL LUA_NOW
		"local out = {}\n"
		"for i = 1, #KEYS do\n"
		"  local H, owner, ttl = KEYS[i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])\n"
		"  local v = redis.call('HGET', H, owner)\n"
		"  out[i] = 0\n"
		"  if v then\n"
		"    local e, rest = string.match(v, '^(%d+) (.*)$')\n"
		"    if tonumber(e) > now then\n"
		"      redis.call('HSET', H, owner, string.format('%d ', now + ttl) .. rest)\n"
		"      if redis.call('PTTL', H) < ttl then redis.call('PEXPIRE', H, ttl) end\n"
		"      out[i] = 1\n"
		"    end\n"
		"  end\n"
		"end\n"
		"return out\n",

	/* ARGV: owner */
	[DLOCK__RS_CANCEL] =
		"local H, owner = KEYS[1], ARGV[1]\n"
		"local W, Q, X = H .. ':w', H .. ':q', H .. ':x'\n"
		LUA_REPL LUA_NOW LUA_HEAD LUA_WAKE
		"redis.call('ZREM', W, owner)\n"
		"local wasx = redis.call('ZREM', X, owner)\n"
		"if redis.call('ZREM', Q, owner) > 0 then\n"
		"  local h = head()\n"
		"  if h then wake(h) end\n"
		"elseif wasx == 1 and redis.call('ZCARD', X) == 0 then\n"
		"  redis.call('PUBLISH', H .. ':c', '*')\n"
		"end\n"
		"return 1\n",

	[DLOCK__RS_STATUS] =
		"local H = KEYS[1]\n"
		"local t = redis.call('TIME')\n"
		"local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
		"return {now, redis.call('GET', H .. ':f') or '0', redis.call('HGETALL', H),\n"
		"        redis.call('ZCOUNT', H .. ':w', '(' .. now, '+inf')}\n",

	/* ARGV: fence. Raise the counter to at least fence (Redlock's second round). */
	[DLOCK__RS_RAISE] =
		"local F = KEYS[1] .. ':f'\n"
		"local c = tonumber(redis.call('GET', F) or '0')\n"
		"local t = tonumber(ARGV[1])\n"
		"if c < t then redis.call('SET', F, ARGV[1]) return t end\n"
		"return c\n",
};

/* ------------------------------------------------------------------------ */
/* servers, connections, errors                                              */
/* ------------------------------------------------------------------------ */

/* Re-raise the last error with another code and a prefix (copies first: the
 * message lives in the buffer dlock_error_set writes). */
static int rewrap(int code, const char *kind, const char *prefix)
{
	char msg[512], sc[64];
	snprintf(msg, sizeof(msg), "%s", dlock_error_last()->message);
	snprintf(sc, sizeof(sc), "%s", dlock_error_last()->store_code);
	return dlock_error_set(code, kind, sc, "%s%s", prefix, msg);
}

int dlock__rserver_parse(dlock__rserver **out, size_t *n, dlock_uri *uri, const char *kind, int default_port,
			 const char *dbpath)
{
	*out = NULL;
	*n = 0;
	if (strcmp(uri->scheme, "rediss") == 0)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, kind, NULL,
				       "rediss:// (Redis over TLS) is not supported: this build uses hiredis %d.%d, "
				       "which has no TLS; use redis:// through a TLS tunnel (stunnel, spiped)",
				       HIREDIS_MAJOR, HIREDIS_MINOR);
	if (!uri->hosts || !*uri->hosts)
		return dlock_error_set(DLOCK_EINVAL, kind, NULL, "%s:// needs a host: %s://host:port", uri->scheme,
				       uri->scheme);
	size_t esc = 0; /* each escaped character takes 3 bytes in the keys */
	for (const char *p = uri->prefix; *p; p++)
		esc += strchr(":%{}", *p) ? 3 : 1;
	if (esc > DLOCK__REDIS_PREFIX_MAX - 4)
		return dlock_error_set(DLOCK_EINVAL, kind, NULL, "prefix is too long (%zu bytes in keys; at most %d)",
				       esc, DLOCK__REDIS_PREFIX_MAX - 4);
	int db = 0;
	const char *p = dbpath ? dbpath : "";
	if (*p == '/')
		p++;
	if (*p) {
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (errno || *end || v < 0 || v > 100000 || end == p)
			return dlock_error_set(DLOCK_EINVAL, kind, NULL,
					       "bad database number '%s' in the URI path (want /0, /1, ...)", p);
		db = (int)v;
	}
	int64_t timeout = uri->connect_timeout_ms < 2000 ? uri->connect_timeout_ms : 2000;
	const char *t = dlock_uri_param(uri, "timeout");
	if (t) {
		int rc = dlock_duration_parse(&timeout, t);
		if (rc)
			return rewrap(DLOCK_EINVAL, kind, "option timeout: ");
		if (timeout < 1)
			return dlock_error_set(DLOCK_EINVAL, kind, NULL, "timeout must be at least 1 ms");
	}
	dlock_hostport *hp = NULL;
	size_t nh = 0;
	int rc = dlock_uri_hosts(uri, default_port, &hp, &nh);
	if (rc)
		return rc;
	dlock__rserver *s = dlock__calloc(nh ? nh : 1, sizeof(*s));
	if (!s) {
		dlock_free(hp);
		return DLOCK_ENOMEM;
	}
	for (size_t i = 0; i < nh; i++) {
		if (uri->password && !dlock__host_is_local(hp[i].host))
			dlock__open_warning("%s: the password and the lock traffic go to %s over plain TCP, which a "
					    "man in the middle can read (rediss:// is not supported by this build: "
					    "use a TLS tunnel such as stunnel)", kind, hp[i].host);
		snprintf(s[i].host, sizeof(s[i].host), "%s", hp[i].host);
		s[i].port = hp[i].port;
		s[i].user = uri->user && *uri->user ? uri->user : NULL; /* ":pw@": default user */
		s[i].password = uri->password;
		s[i].db = db;
		s[i].connect_timeout_ms = uri->connect_timeout_ms;
		s[i].timeout_ms = timeout;
	}
	dlock_free(hp);
	if (uri->user && !uri->password) {
		free(s);
		return dlock_error_set(DLOCK_EINVAL, kind, NULL,
				       "a user name without a password: write %s://user:password@host", uri->scheme);
	}
	*out = s;
	*n = nh;
	return 0;
}

int dlock__rconn_error(const redisContext *c, const dlock__rserver *srv, const char *kind)
{
	const char *what = c && c->errstr[0] ? c->errstr : "connection lost";
	if (c && c->err == REDIS_ERR_EOF)
		what = "server closed the connection";
	return dlock_error_set(DLOCK_EUNAVAILABLE, kind,
			       !c ? "ECONN" : c->err == REDIS_ERR_IO ? "EIO" : c->err == REDIS_ERR_PROTOCOL ? "EPROTO" : "ECONN",
			       "%s %s:%d: %s", kind, srv->host, srv->port, what);
}

int dlock__rreply_error(const redisReply *r, const dlock__rserver *srv, const char *kind)
{
	char code[32];
	size_t i = 0;
	const char *s = r && r->str ? r->str : "";
	while (s[i] && s[i] != ' ' && i < sizeof(code) - 1) {
		code[i] = s[i];
		i++;
	}
	code[i] = 0;
	int rc = DLOCK_ESTORE;
	if (!strcmp(code, "NOAUTH") || !strcmp(code, "WRONGPASS") || !strcmp(code, "NOPERM") ||
	    strstr(s, "invalid password") || strstr(s, "invalid username-password"))
		rc = DLOCK_EAUTH;
	else if (!strcmp(code, "LOADING") || !strcmp(code, "BUSY") || !strcmp(code, "MASTERDOWN") ||
		 !strcmp(code, "TRYAGAIN") || !strcmp(code, "CLUSTERDOWN"))
		rc = DLOCK_EUNAVAILABLE;
	return dlock_error_set(rc, kind, code, "%s %s:%d: %s", kind, srv->host, srv->port, s);
}

/* ---- replies of bounded size (a hostile or broken server) ---- */

/*
 * hiredis 0.14 buffers a whole bulk string before it makes the reply, and
 * allocates an array's pointers (and then each element) as the header says:
 * "$2000000000" or "*25000000" would make the client allocate gigabytes.
 * Every read goes through dlock__rbuffer_read, which refuses a buffer of
 * unparsed reply bytes over DLOCK__REDIS_REPLY_MAX_BYTES, and the reader's
 * createArray is wrapped to refuse a reply whose arrays together announce
 * more than DLOCK__REDIS_REPLY_MAX_ELEMENTS elements (counted in the
 * reader's privdata, which hiredis does not use). Either sets a protocol
 * error on the context: the caller drops the connection.
 */
static redisReplyObjectFunctions base_fn, capped_fn;
static pthread_once_t capped_once = PTHREAD_ONCE_INIT;

static redisReader *reader_of(const redisReadTask *t)
{
	while (t->parent)
		t = t->parent;
	/* the root task is rstack[0] of its reader */
	return (redisReader *)(void *)((char *)(uintptr_t)t - offsetof(redisReader, rstack));
}

static void *capped_array(const redisReadTask *t, int elements)
{
	redisReader *r = reader_of(t);
	uintptr_t seen = t->parent ? (uintptr_t)r->privdata : 0;
	seen += elements > 0 ? (uintptr_t)elements : 0;
	r->privdata = (void *)seen;
	if (seen > DLOCK__REDIS_REPLY_MAX_ELEMENTS)
		return NULL; /* hiredis reports "Out of memory"; dlock__rget_reply renames it */
	return base_fn.createArray(t, elements);
}

static void capped_init(void)
{
	redisReader *r = redisReaderCreate();
	if (!r)
		abort();
	base_fn = capped_fn = *r->fn;
	capped_fn.createArray = capped_array;
	redisReaderFree(r);
}

static void capped_install(redisContext *c)
{
	if (c->reader->fn != &capped_fn) {
		pthread_once(&capped_once, capped_init);
		c->reader->fn = &capped_fn;
		c->reader->privdata = NULL;
	}
}

static int refuse(redisContext *c, const char *fmt, unsigned long cap)
{
	c->err = REDIS_ERR_PROTOCOL;
	snprintf(c->errstr, sizeof(c->errstr), fmt, cap);
	return REDIS_ERR;
}

int dlock__rbuffer_read(redisContext *c)
{
	capped_install(c);
	if (redisBufferRead(c) != REDIS_OK)
		return REDIS_ERR;
	if (c->reader->len - c->reader->pos > DLOCK__REDIS_REPLY_MAX_BYTES)
		return refuse(c, "reply refused: more than %lu MiB (a hostile or broken server?)",
			      (unsigned long)DLOCK__REDIS_REPLY_MAX_BYTES >> 20);
	return REDIS_OK;
}

int dlock__rget_reply(redisContext *c, void **reply)
{
	capped_install(c);
	if (redisGetReplyFromReader(c, reply) == REDIS_OK)
		return REDIS_OK;
	if ((uintptr_t)c->reader->privdata > DLOCK__REDIS_REPLY_MAX_ELEMENTS)
		return refuse(c, "reply refused: more than %lu elements (a hostile or broken server?)",
			      (unsigned long)DLOCK__REDIS_REPLY_MAX_ELEMENTS);
	return REDIS_ERR;
}

/* ---- I/O bounded by a deadline ---- */

enum { IO_OK = 0, IO_ERR = -1, IO_TIMEOUT = -2 };

static int64_t ms_left(int64_t deadline)
{
	int64_t left = deadline - dlock_clock_ms();
	return left > 0 ? left : 0;
}

/* 1: fd ready for ev; 0: the deadline passed; -1: poll failed. */
static int fd_wait(int fd, short ev, int64_t deadline)
{
	for (;;) {
		int64_t left = ms_left(deadline);
		if (left <= 0)
			return 0;
		struct pollfd p = { fd, ev, 0 };
		int r = poll(&p, 1, left > 60000 ? 60000 : (int)left);
		if (r > 0)
			return 1;
		if (r < 0 && errno != EINTR)
			return -1;
	}
}

/* Write what is buffered by the deadline. Works on blocking sockets too (poll
 * first: a short command then goes out in one write). */
static int io_flush(redisContext *c, int64_t deadline)
{
	int done = 0;
	for (;;) {
		if (redisBufferWrite(c, &done) != REDIS_OK)
			return IO_ERR;
		if (done)
			return IO_OK;
		int w = fd_wait(c->fd, POLLOUT, deadline);
		if (w <= 0)
			return w == 0 ? IO_TIMEOUT : IO_ERR;
	}
}

/* Flush, then read the next reply by the deadline. */
static int io_reply(redisContext *c, int64_t deadline, redisReply **out)
{
	*out = NULL;
	int rc = io_flush(c, deadline);
	if (rc)
		return rc;
	for (;;) {
		void *v = NULL;
		if (dlock__rget_reply(c, &v) != REDIS_OK)
			return IO_ERR;
		if (v) {
			*out = v;
			return IO_OK;
		}
		int w = fd_wait(c->fd, POLLIN, deadline);
		if (w <= 0)
			return w == 0 ? IO_TIMEOUT : IO_ERR;
		if (dlock__rbuffer_read(c) != REDIS_OK)
			return IO_ERR;
	}
}

static int io_error(int io, const redisContext *c, const dlock__rserver *srv, const char *kind)
{
	if (io == IO_TIMEOUT)
		return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "ETIMEDOUT", "%s %s:%d: timed out waiting for the server",
				       kind, srv->host, srv->port);
	if (c->err)
		return dlock__rconn_error(c, srv, kind);
	return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "EIO", "%s %s:%d: %s", kind, srv->host, srv->port,
			       strerror(errno));
}

int dlock__rread_by(redisContext *c, const dlock__rserver *srv, const char *kind, int64_t deadline,
		    redisReply **out)
{
	int io = io_reply(c, deadline, out);
	return io ? io_error(io, c, srv, kind) : 0;
}

void dlock__rsock_setup(redisContext *c, int64_t timeout_ms)
{
	int fd = c->fd, on = 1;
	int idle = (int)(timeout_ms / 1000) > 1 ? (int)(timeout_ms / 1000) : 1, intvl = 1, cnt = 3;
	/* a silent peer (cut cable, dead host) is noticed by the kernel: keepalive
	 * probes on an idle socket, and unacknowledged data (or probes) kill the
	 * connection after TCP_USER_TIMEOUT */
	unsigned int user = (unsigned int)(timeout_ms > 1000 ? timeout_ms : 1000) + (unsigned int)(idle + 3) * 1000;
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user));
}

static int simple_cmd(redisContext *c, const dlock__rserver *srv, const char *kind, int argc, const char **argv,
		      int64_t deadline)
{
	redisReply *r = NULL;
	redisAppendCommandArgv(c, argc, argv, NULL);
	int rc = dlock__rread_by(c, srv, kind, deadline, &r);
	if (rc)
		return rc;
	if (r->type == REDIS_REPLY_ERROR)
		rc = dlock__rreply_error(r, srv, kind);
	freeReplyObject(r);
	return rc;
}

/* connect + AUTH + SELECT by the deadline; nonblock: leave the socket non-blocking. */
static int connect_by(redisContext **out, const dlock__rserver *srv, const char *kind, int64_t deadline,
		      bool nonblock)
{
	*out = NULL;
	int64_t ct = ms_left(deadline);
	if (ct > srv->connect_timeout_ms)
		ct = srv->connect_timeout_ms;
	if (ct <= 0)
		return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "ETIMEDOUT", "cannot connect to %s %s:%d: timed out",
				       kind, srv->host, srv->port);
	/* hiredis resolves with a blocking getaddrinfo: resolve by the deadline
	 * here and hand it the addresses, tried in order within the same bound */
	int64_t end = dlock_clock_ms() + ct;
	dlock__addrs ad;
	int rrc = dlock__resolve(&ad, srv->host, end, kind);
	if (rrc)
		return rrc;
	redisContext *c = NULL;
	for (size_t i = 0; i < (ad.n ? ad.n : 1); i++) {
		int64_t left = end - dlock_clock_ms();
		if (c) {
			if (left <= 0)
				break;
			redisFree(c);
		}
		c = redisConnectWithTimeout(ad.n ? ad.addr[i] : srv->host, srv->port, dlock__ms_timeval(left > 0 ? left : 1));
		if (!c)
			return dlock__oom();
		if (!c->err)
			break;
	}
	if (c->err) {
		bool to = c->err == REDIS_ERR_IO && (strstr(c->errstr, "timed out") || strstr(c->errstr, "Timeout"));
		int rc = dlock_error_set(DLOCK_EUNAVAILABLE, kind, to ? "ETIMEDOUT" : "ECONN",
					 "cannot connect to %s %s:%d: %s%s", kind, srv->host, srv->port, c->errstr,
					 to && !strstr(c->errstr, "timed out") ? " (timed out)" : "");
		redisFree(c);
		return rc;
	}
	dlock__rsock_setup(c, srv->timeout_ms);
	if (nonblock) {
		/* every read and write goes through poll with the caller's deadline */
		int fl = fcntl(c->fd, F_GETFL);
		if (fl >= 0)
			fcntl(c->fd, F_SETFL, fl | O_NONBLOCK);
		c->flags &= ~REDIS_BLOCK;
	} else {
		redisSetTimeout(c, dlock__ms_timeval(srv->timeout_ms));
	}
	int rc = 0;
	if (srv->password) {
		/* "redis://:pw@host" parses with an empty user: that is the default
		 * user's password (AUTH pw), not a user named "". */
		const char *user = srv->user && *srv->user ? srv->user : NULL;
		const char *a[3] = { "AUTH", user ? user : srv->password, srv->password };
		rc = simple_cmd(c, srv, kind, user ? 3 : 2, a, deadline);
		if (rc == DLOCK_ESTORE) /* e.g. "ERR AUTH <password> called without any password configured" */
			rc = rewrap(DLOCK_EAUTH, kind, "");
	}
	if (!rc && srv->db) {
		char db[16];
		snprintf(db, sizeof(db), "%d", srv->db);
		const char *a[2] = { "SELECT", db };
		rc = simple_cmd(c, srv, kind, 2, a, deadline);
		if (rc == DLOCK_ESTORE)
			rc = rewrap(DLOCK_EINVAL, kind, "cannot use the database of the URI path: ");
	}
	if (rc) {
		redisFree(c);
		return rc;
	}
	*out = c;
	return 0;
}

int dlock__rconnect_by(redisContext **out, const dlock__rserver *srv, const char *kind, int64_t deadline)
{
	return connect_by(out, srv, kind, deadline, true);
}

int dlock__rconnect(redisContext **out, const dlock__rserver *srv, const char *kind)
{
	return connect_by(out, srv, kind, dlock_clock_ms() + srv->connect_timeout_ms + 2 * srv->timeout_ms, false);
}

/* ------------------------------------------------------------------------ */
/* keys and arguments                                                        */
/* ------------------------------------------------------------------------ */

/*
 * The prefix as it appears in keys: ':' (which ends it), '%' (the escape) and
 * the hash-tag braces are percent-escaped, so "{P:NAME}" is injective: prefix
 * "app" + name "jobs:x" and prefix "app:jobs" + name "x" are different keys.
 * A prefix without those characters (the default "dlock") is unchanged.
 */
size_t dlock__rprefix_enc(char *out, size_t cap, const char *prefix)
{
	size_t o = 0;
	for (const char *p = prefix; *p && o + 4 < cap; p++) {
		if (strchr(":%{}", *p))
			o += (size_t)snprintf(out + o, cap - o, "%%%02X", (unsigned char)*p);
		else
			out[o++] = *p;
	}
	out[o] = 0;
	return o;
}

void dlock__rkeys_make(dlock__rkeys *k, const char *prefix, const char *name)
{
	static const char *const suffix[DLOCK__RK_COUNT] = { "", ":c" };
	char pe[DLOCK__REDIS_PREFIX_MAX + 1];
	dlock__rprefix_enc(pe, sizeof(pe), prefix);
	for (int i = 0; i < DLOCK__RK_COUNT; i++) {
		int n = snprintf(k->k[i], sizeof(k->k[i]), "{%s:%s}%s", pe, name, suffix[i]);
		k->len[i] = (size_t)n < sizeof(k->k[i]) ? (size_t)n : sizeof(k->k[i]) - 1;
	}
}

static void arg(dlock__rargs *a, const char *s, size_t len)
{
	a->argv[a->argc] = s;
	a->lens[a->argc] = len;
	a->argc++;
}

static void arg_s(dlock__rargs *a, const char *s)
{
	arg(a, s, strlen(s));
}

static void arg_i(dlock__rargs *a, int slot, long long v)
{
	int n = snprintf(a->nums[slot], sizeof(a->nums[slot]), "%lld", v);
	arg(a, a->nums[slot], (size_t)n);
}

static void arg_key(dlock__rargs *a, const dlock__rkeys *k, int which)
{
	arg(a, k->k[which], k->len[which]);
}

/* Marks a request registered as a waiter by an earlier refused try (req->slot). */
static char registered_mark;

void dlock__rargs_acquire(dlock__rargs *a, const dlock__rkeys *k, const dlock_request *req, int64_t ticket)
{
	a->argc = 2;
	arg_s(a, "1");
	arg_key(a, k, DLOCK__RK_H);
	arg_s(a, req->owner);
	arg_i(a, 0, req->ttl_ms);
	a->flags[0] = req->mode == DLOCK_SHARED ? 's' : 'x';
	a->flags[1] = req->fair ? '1' : '0';
	a->flags[2] = !req->waiting ? '0' : req->slot == &registered_mark ? '2' : '1';
	a->flags[3] = 0;
	arg(a, a->flags, 3);
	arg_i(a, 1, req->permits);
	arg_i(a, 2, req->queue_ttl_ms);
	int n = snprintf(a->meta, sizeof(a->meta), "%d %s", req->pid, req->host ? req->host : "");
	arg(a, a->meta, (size_t)n < sizeof(a->meta) ? (size_t)n : sizeof(a->meta) - 1);
	if (ticket > 0)
		arg_i(a, 3, ticket);
	else
		arg_s(a, "");
}

void dlock__racquire_done(dlock_request *req, int rc)
{
	if (rc == DLOCK_ELOCKED && req->waiting)
		req->slot = &registered_mark;
	else if (rc == 0)
		req->slot = NULL;
}

void dlock__rargs_owner(dlock__rargs *a, const dlock__rkeys *k, const dlock_request *req)
{
	a->argc = 2;
	arg_s(a, "1");
	arg_key(a, k, DLOCK__RK_H);
	arg_s(a, req->owner);
}

void dlock__rargs_status(dlock__rargs *a, const dlock__rkeys *k)
{
	a->argc = 2;
	arg_s(a, "1");
	arg_key(a, k, DLOCK__RK_H);
}

/* ------------------------------------------------------------------------ */
/* replies                                                                   */
/* ------------------------------------------------------------------------ */

static int bad_reply(const char *kind, const char *what)
{
	return dlock_error_set(DLOCK_ESTORE, kind, NULL, "unexpected reply from %s to %s", kind, what);
}

static int reply_int(const redisReply *r, long long *v)
{
	if (r->type == REDIS_REPLY_INTEGER) {
		*v = r->integer;
		return 0;
	}
	if (r->type == REDIS_REPLY_STRING) {
		char *end;
		errno = 0;
		*v = strtoll(r->str, &end, 10);
		return errno || end == r->str || *end ? -1 : 0;
	}
	return -1;
}

int dlock__racquire_reply(const redisReply *r, uint64_t *fence, int64_t *retry_ms, const char *kind)
{
	long long ok, v;
	if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || r->elements > 3 || reply_int(r->element[0], &ok) ||
	    reply_int(r->element[1], &v))
		return bad_reply(kind, "acquire");
	if (ok == 1) {
		*fence = (uint64_t)v;
		return 0;
	}
	if (retry_ms)
		*retry_ms = v;
	return DLOCK_ELOCKED;
}

int dlock__rstatus_decode(const redisReply *r, const char *name, dlock_lock_status **out, size_t *count,
			  const char *kind)
{
	long long now, fence, waiters;
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 4 || reply_int(r->element[0], &now) ||
	    reply_int(r->element[1], &fence) || r->element[2]->type != REDIS_REPLY_ARRAY ||
	    reply_int(r->element[3], &waiters))
		return bad_reply(kind, "status");
	dlock_lock_status *st = dlock__status_add(out, count);
	if (!st || !(st->name = dlock__strdup(name)))
		return DLOCK_ENOMEM;
	st->last_fence = (uint64_t)fence;
	st->waiters = (size_t)waiters;
	const redisReply *h = r->element[2];
	unsigned int permits = 1;
	for (size_t i = 0; i + 1 < h->elements; i += 2) {
		const redisReply *k = h->element[i], *v = h->element[i + 1];
		if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
			continue;
		long long exp, f;
		char mode;
		unsigned int p;
		int pid, used = 0;
		if (sscanf(v->str, "%lld %lld %c %u %d %n", &exp, &f, &mode, &p, &pid, &used) < 5 || exp <= now)
			continue; /* expired holders are gone, even if not yet pruned */
		permits = p;
		dlock_holder *ho = dlock__status_add_holder(st);
		if (!ho || !(ho->owner = dlock__strdup(k->str)) ||
		    !(ho->host = dlock__strdup(used ? v->str + used : "")))
			return DLOCK_ENOMEM;
		ho->pid = pid;
		ho->mode = mode == 's' ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
		ho->fence = (uint64_t)f;
		ho->ttl_left_ms = exp - now;
	}
	st->permits = st->nholders && permits > 1 ? permits : 1;
	return 0;
}

int dlock__rbatch_renew(dlock__rbatch *b, const char *prefix, dlock_request *const *reqs, size_t n)
{
	/* one script call for the whole batch: keys, then (owner, ttl) pairs */
	memset(b, 0, sizeof(*b));
	b->argc = (int)(3 + 3 * n);
	b->argv = calloc((size_t)b->argc, sizeof(*b->argv));
	b->lens = calloc((size_t)b->argc, sizeof(*b->lens));
	b->keys = malloc(n * DLOCK__REDIS_KEY_MAX);
	b->nums = malloc(n * 24 + 24);
	if (!b->argv || !b->lens || !b->keys || !b->nums) {
		dlock__rbatch_free(b);
		return dlock__oom();
	}
	char pe[DLOCK__REDIS_PREFIX_MAX + 1];
	dlock__rprefix_enc(pe, sizeof(pe), prefix);
	snprintf(b->nums + n * 24, 24, "%zu", n);
	b->argv[2] = b->nums + n * 24;
	b->lens[2] = strlen(b->argv[2]);
	for (size_t i = 0; i < n; i++) {
		char *key = b->keys + i * DLOCK__REDIS_KEY_MAX;
		int kl = snprintf(key, DLOCK__REDIS_KEY_MAX, "{%s:%s}", pe, reqs[i]->name);
		b->argv[3 + i] = key;
		b->lens[3 + i] = (size_t)kl;
		b->argv[3 + n + 2 * i] = reqs[i]->owner;
		b->lens[3 + n + 2 * i] = strlen(reqs[i]->owner);
		int nl = snprintf(b->nums + i * 24, 24, "%lld", (long long)reqs[i]->ttl_ms);
		b->argv[3 + n + 2 * i + 1] = b->nums + i * 24;
		b->lens[3 + n + 2 * i + 1] = (size_t)nl;
	}
	return 0;
}

void dlock__rbatch_free(dlock__rbatch *b)
{
	free(b->argv);
	free(b->lens);
	free(b->keys);
	free(b->nums);
	memset(b, 0, sizeof(*b));
}

int dlock__rrenew_reply(const redisReply *r, size_t n, int *results, const char *kind)
{
	if (r->type != REDIS_REPLY_ARRAY || r->elements != n)
		return bad_reply(kind, "renew");
	for (size_t i = 0; i < n; i++) {
		long long v = 0;
		results[i] = reply_int(r->element[i], &v) == 0 && v == 1 ? 0 : DLOCK_ENOTHELD;
	}
	return 0;
}

/* ------------------------------------------------------------------------ */
/* notifier                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * Waiting without polling, and without missing a release.
 *
 * One background thread per store handle owns one subscriber connection per
 * server and SUBSCRIBEs to the channel of every lock some thread of this
 * process is waiting for. A waiter is identified by its dlock_request (one per
 * lock handle, stable across the tries of one acquire) and carries a
 * generation counter that the thread bumps for every release message meant
 * for it ("*", or its own owner token when a fair queue names the head).
 *
 * The race: the core tries acquire, is refused, then calls wait. A release
 * that lands between the refusal and the SUBSCRIBE would be lost and the
 * waiter would sleep for the full nap. Closed in two steps:
 *  1. the first wait of a waiter subscribes, waits for Redis to confirm the
 *     subscription and returns at once, so the core tries again while already
 *     subscribed;
 *  2. the subscription then stays up across tries, and acquire (arm) records
 *     the waiter's generation *before* sending its try: a release after that
 *     point bumps the generation, so the following wait returns at once
 *     instead of sleeping. A release before it is seen by the try itself.
 * The subscription is dropped when the waiter is granted, releases, cancels,
 * or (a backstop) stays idle for FORGET_IDLE_MS.
 */
#define FORGET_IDLE_MS 10000
#define RECONNECT_MAX_MS 2000

typedef struct rn_chan {
	struct rn_chan *next;
	char *name;            /* the lock's channel "{P:NAME}:c": wake-everyone messages */
	size_t len;
	char *direct;          /* "{P:NAME}:c:<client id>": wake-ups naming our waiters */
	size_t dlen;
	int refs;              /* waiters that want it */
	unsigned char *sent;   /* per server: SUBSCRIBE sent (and no UNSUBSCRIBE since) */
	int *pend;             /* per server: SUBSCRIBE replies still to come */
	unsigned char *ok;     /* per server: confirmed */
	char *last;            /* last wake-all message (to drop the other masters' copies) */
	unsigned char *heard;  /* per server: has delivered `last` (a second copy from the
				  same server is a new release, e.g. a second bare "*") */
} rn_chan;

typedef struct rn_waiter {
	struct rn_waiter *next;
	const dlock_request *req;
	char owner[64];
	rn_chan *chan;
	uint64_t gen, seen;
	int inwait;
	int64_t last;
} rn_waiter;

struct dlock__rnotify {
	const char *kind;
	dlock__rserver *srv;  /* the store's; moved only under mu (dlock__rnotify_moved) */
	size_t n;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	bool started, stop;
	int pipe[2];
	redisContext **c;       /* non-blocking sockets: nothing here blocks the thread */
	int64_t *retry_at, *backoff;
	int64_t *sub_since;     /* per server: oldest SUBSCRIBE not yet confirmed (0: none) */
	unsigned char *wantw;   /* per server: output still buffered (poll for POLLOUT) */
	rn_chan *chans;
	rn_waiter *waiters;
};

int dlock__rnotify_new(dlock__rnotify **out, dlock__rserver *srv, size_t n, const char *kind)
{
	*out = NULL;
	dlock__rnotify *nt = dlock__calloc(1, sizeof(*nt));
	if (!nt)
		return DLOCK_ENOMEM;
	nt->kind = kind;
	nt->srv = srv;
	nt->n = n;
	nt->pipe[0] = nt->pipe[1] = -1;
	nt->c = calloc(n, sizeof(*nt->c));
	nt->retry_at = calloc(n, sizeof(*nt->retry_at));
	nt->backoff = calloc(n, sizeof(*nt->backoff));
	nt->sub_since = calloc(n, sizeof(*nt->sub_since));
	nt->wantw = calloc(n, 1);
	if (!nt->c || !nt->retry_at || !nt->backoff || !nt->sub_since || !nt->wantw || pipe2(nt->pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		int rc = nt->c && nt->retry_at && nt->backoff && nt->sub_since && nt->wantw
				 ? dlock_error_set(DLOCK_ESTORE, kind, NULL, "pipe: %s", strerror(errno))
				 : dlock__oom();
		dlock__rnotify_free(nt);
		return rc;
	}
	pthread_mutex_init(&nt->mu, NULL);
	dlock__cond_init_monotonic(&nt->cv);
	*out = nt;
	return 0;
}

static void kick(dlock__rnotify *nt)
{
	char b = 1;
	ssize_t w = write(nt->pipe[1], &b, 1);
	(void)w; /* a full pipe already holds a wake-up */
}

static void chan_free(rn_chan *ch)
{
	free(ch->last);
	free(ch->heard);
	free(ch->name);
	free(ch->direct);
	free(ch->sent);
	free(ch->pend);
	free(ch->ok);
	free(ch);
}

void dlock__rnotify_free(dlock__rnotify *nt)
{
	if (!nt)
		return;
	if (nt->started) {
		pthread_mutex_lock(&nt->mu);
		nt->stop = true;
		pthread_mutex_unlock(&nt->mu);
		kick(nt);
		pthread_join(nt->th, NULL);
	}
	if (nt->pipe[0] >= 0) {
		close(nt->pipe[0]);
		close(nt->pipe[1]);
		pthread_mutex_destroy(&nt->mu);
		pthread_cond_destroy(&nt->cv);
	}
	for (size_t i = 0; nt->c && i < nt->n; i++)
		if (nt->c[i])
			redisFree(nt->c[i]);
	while (nt->waiters) {
		rn_waiter *w = nt->waiters;
		nt->waiters = w->next;
		free(w);
	}
	while (nt->chans) {
		rn_chan *ch = nt->chans;
		nt->chans = ch->next;
		chan_free(ch);
	}
	free(nt->c);
	free(nt->retry_at);
	free(nt->backoff);
	free(nt->sub_since);
	free(nt->wantw);
	free(nt);
}

static bool chan_ok(const dlock__rnotify *nt, const rn_chan *ch)
{
	for (size_t i = 0; i < nt->n; i++)
		if (ch->ok[i])
			return true;
	return false;
}


/* A lock's channels by either name: the lock's own, or our direct one (the
 * two never collide: a lock's channel ends in "}:c", a direct one in hex). */
static rn_chan *chan_find(dlock__rnotify *nt, const char *name, size_t len)
{
	for (rn_chan *ch = nt->chans; ch; ch = ch->next)
		if ((ch->len == len && !memcmp(ch->name, name, len)) ||
		    (ch->direct && ch->dlen == len && !memcmp(ch->direct, name, len)))
			return ch;
	return NULL;
}

static rn_waiter *waiter_find(dlock__rnotify *nt, const dlock_request *req)
{
	for (rn_waiter *w = nt->waiters; w; w = w->next)
		if (w->req == req)
			return w;
	return NULL;
}

static void waiter_unlink(dlock__rnotify *nt, rn_waiter *w)
{
	for (rn_waiter **p = &nt->waiters; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			break;
		}
	if (--w->chan->refs == 0)
		kick(nt);
	free(w);
}

static void drop_conn(dlock__rnotify *nt, size_t i)
{
	redisFree(nt->c[i]);
	nt->c[i] = NULL;
	nt->sub_since[i] = 0;
	nt->wantw[i] = 0;
	for (rn_chan *ch = nt->chans; ch; ch = ch->next)
		ch->sent[i] = ch->pend[i] = ch->ok[i] = 0;
	int64_t b = nt->backoff[i] ? nt->backoff[i] * 2 : 100;
	nt->backoff[i] = b < RECONNECT_MAX_MS ? b : RECONNECT_MAX_MS;
	nt->retry_at[i] = dlock_clock_ms() + nt->backoff[i];
}

static void on_reply(dlock__rnotify *nt, size_t i, redisReply *r)
{
	if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_STRING ||
	    r->element[1]->type != REDIS_REPLY_STRING)
		return;
	const char *what = r->element[0]->str;
	rn_chan *ch = chan_find(nt, r->element[1]->str, r->element[1]->len);
	if (!ch)
		return;
	if (!strcmp(what, "subscribe")) {
		if (ch->pend[i] > 0 && --ch->pend[i] == 0 && ch->sent[i]) {
			ch->ok[i] = 1;
			pthread_cond_broadcast(&nt->cv);
		}
		bool pending = false;
		for (rn_chan *o = nt->chans; o && !pending; o = o->next)
			pending = o->pend[i] > 0;
		if (!pending)
			nt->sub_since[i] = 0;
	} else if (!strcmp(what, "message") && r->element[2]->type == REDIS_REPLY_STRING) {
		const char *msg = r->element[2]->str;
		bool all = msg[0] == '*';
		/* the same release heard from another master (Redlock): already counted.
		 * The same text again from a server that already delivered it is a new
		 * event (a second bare "*" of a cancel, or any repeat on one server). */
		if (all && ch->last && !strcmp(ch->last, msg) && !ch->heard[i]) {
			ch->heard[i] = 1;
			return;
		}
		if (all) {
			free(ch->last);
			ch->last = strdup(msg);
			memset(ch->heard, 0, nt->n);
			ch->heard[i] = 1;
		}
		/* wake the waiting threads only when one of them is meant: a release
		 * naming another process's waiter is nothing to us */
		bool woke = false;
		for (rn_waiter *w = nt->waiters; w; w = w->next)
			if (w->chan == ch && (all || !strcmp(msg, w->owner))) {
				w->gen++;
				woke = true;
			}
		if (woke)
			pthread_cond_broadcast(&nt->cv);
	}
}

/* Bring each server's subscriptions in line with what waiters want. Under mu. */
static void sync_subs(dlock__rnotify *nt)
{
	for (size_t i = 0; i < nt->n; i++) {
		if (!nt->c[i])
			continue;
		for (rn_chan *ch = nt->chans; ch; ch = ch->next) {
			const char *verb = NULL;
			int nch = ch->direct ? 2 : 1;
			if (ch->refs > 0 && !ch->sent[i]) {
				verb = "SUBSCRIBE";
				ch->sent[i] = 1;
				ch->pend[i] += nch; /* one confirmation per channel */
				if (!nt->sub_since[i])
					nt->sub_since[i] = dlock_clock_ms();
			} else if (ch->refs == 0 && ch->sent[i]) {
				verb = "UNSUBSCRIBE";
				ch->sent[i] = ch->ok[i] = 0;
			}
			if (verb) {
				const char *argv[3] = { verb, ch->name, ch->direct };
				size_t lens[3] = { strlen(verb), ch->len, ch->dlen };
				redisAppendCommandArgv(nt->c[i], 1 + nch, argv, lens);
			}
		}
		/* non-blocking: what does not fit now goes when poll says POLLOUT */
		int done = 0;
		if (redisBufferWrite(nt->c[i], &done) != REDIS_OK)
			drop_conn(nt, i);
		else
			nt->wantw[i] = !done;
	}
	/* forget channels nobody wants once unsubscribed everywhere */
	for (rn_chan **p = &nt->chans; *p;) {
		rn_chan *ch = *p;
		bool any = false;
		for (size_t i = 0; i < nt->n; i++)
			any |= ch->sent[i] != 0;
		if (ch->refs == 0 && !any) {
			*p = ch->next;
			chan_free(ch);
		} else {
			p = &ch->next;
		}
	}
}

static void *notify_main(void *arg)
{
	dlock__rnotify *nt = arg;
	struct pollfd *pf = calloc(nt->n + 1, sizeof(*pf));
	size_t *pidx = calloc(nt->n + 1, sizeof(*pidx));
	if (!pf || !pidx) {
		free(pf);
		free(pidx);
		return NULL;
	}
	pthread_mutex_lock(&nt->mu);
	while (!nt->stop) {
		int64_t now = dlock_clock_ms();
		bool wanted = false;
		for (rn_chan *ch = nt->chans; ch; ch = ch->next)
			wanted |= ch->refs > 0;
		/* (re)connect servers that are down while someone waits */
		for (size_t i = 0; i < nt->n && wanted; i++) {
			if (nt->c[i] || now < nt->retry_at[i])
				continue;
			redisContext *c = NULL;
			/* short: this thread also serves the other servers' messages */
			dlock__rserver quick = nt->srv[i];
			int64_t limit = quick.timeout_ms < 500 ? quick.timeout_ms : 500;
			pthread_mutex_unlock(&nt->mu);
			int rc = dlock__rconnect_by(&c, &quick, nt->kind, dlock_clock_ms() + limit);
			pthread_mutex_lock(&nt->mu);
			if (rc) {
				int64_t b = nt->backoff[i] ? nt->backoff[i] * 2 : 100;
				nt->backoff[i] = b < RECONNECT_MAX_MS ? b : RECONNECT_MAX_MS;
				nt->retry_at[i] = dlock_clock_ms() + nt->backoff[i];
				continue;
			}
			bool again = nt->backoff[i] != 0;
			nt->c[i] = c;
			nt->backoff[i] = 0;
			if (again) { /* releases during the outage were not heard: everyone retries */
				for (rn_waiter *w = nt->waiters; w; w = w->next)
					w->gen++;
				pthread_cond_broadcast(&nt->cv);
			}
		}
		sync_subs(nt);
		/* a subscription not confirmed in time: the connection hangs (a dead
		 * link, a stopped server): drop it, so that it is made again */
		now = dlock_clock_ms();
		int64_t next_check = INT64_MAX;
		for (size_t i = 0; i < nt->n; i++) {
			if (!nt->c[i] || !nt->sub_since[i])
				continue;
			int64_t limit = nt->srv[i].timeout_ms;
			if (now - nt->sub_since[i] >= limit) {
				drop_conn(nt, i);
			} else if (nt->sub_since[i] + limit < next_check) {
				next_check = nt->sub_since[i] + limit;
			}
		}
		/* backstop for waiters whose caller vanished without forget */
		for (rn_waiter *w = nt->waiters, *next; w; w = next) {
			next = w->next;
			if (!w->inwait && now - w->last > FORGET_IDLE_MS)
				waiter_unlink(nt, w);
		}
		size_t np = 0;
		pf[np].fd = nt->pipe[0];
		pf[np].events = POLLIN;
		np++;
		bool down = false;
		for (size_t i = 0; i < nt->n; i++) {
			if (nt->c[i]) {
				pf[np].fd = nt->c[i]->fd;
				pf[np].events = POLLIN | (nt->wantw[i] ? POLLOUT : 0);
				pidx[np] = i;
				np++;
			} else {
				down = true;
			}
		}
		/* a timer only while there is local bookkeeping to do; no network polling */
		int timeout = nt->waiters ? 1000 : -1;
		if (down && wanted)
			timeout = 100;
		if (next_check != INT64_MAX) {
			int64_t t = next_check - now + 1;
			if (timeout < 0 || t < timeout)
				timeout = (int)t;
		}
		pthread_mutex_unlock(&nt->mu);
		int pr = poll(pf, np, timeout);
		pthread_mutex_lock(&nt->mu);
		if (pr <= 0)
			continue;
		if (pf[0].revents) {
			char buf[64];
			while (read(nt->pipe[0], buf, sizeof(buf)) > 0)
				;
		}
		for (size_t k = 1; k < np; k++) {
			size_t i = pidx[k];
			if (!pf[k].revents || !nt->c[i] || nt->c[i]->fd != pf[k].fd)
				continue;
			if (pf[k].revents & POLLOUT) {
				int done = 0;
				if (redisBufferWrite(nt->c[i], &done) != REDIS_OK) {
					drop_conn(nt, i);
					continue;
				}
				nt->wantw[i] = !done;
			}
			if (!(pf[k].revents & (POLLIN | POLLERR | POLLHUP)))
				continue;
			if (dlock__rbuffer_read(nt->c[i]) != REDIS_OK) {
				drop_conn(nt, i);
				continue;
			}
			void *r = NULL;
			while (nt->c[i] && dlock__rget_reply(nt->c[i], &r) == REDIS_OK && r) {
				on_reply(nt, i, r);
				freeReplyObject(r);
				r = NULL;
			}
			if (nt->c[i] && nt->c[i]->err)
				drop_conn(nt, i);
		}
	}
	pthread_mutex_unlock(&nt->mu);
	free(pf);
	free(pidx);
	return NULL;
}

void dlock__rnotify_moved(dlock__rnotify *nt, size_t i, const char *host, int port)
{
	pthread_mutex_lock(&nt->mu);
	if (strcmp(nt->srv[i].host, host) != 0 || nt->srv[i].port != port) {
		snprintf(nt->srv[i].host, sizeof(nt->srv[i].host), "%s", host);
		nt->srv[i].port = port;
		if (nt->c[i]) { /* listen where the releases are published now */
			drop_conn(nt, i);
			nt->retry_at[i] = 0;
			kick(nt);
		}
	}
	pthread_mutex_unlock(&nt->mu);
}

void dlock__rnotify_arm(dlock__rnotify *nt, const dlock_request *req)
{
	pthread_mutex_lock(&nt->mu);
	rn_waiter *w = waiter_find(nt, req);
	if (w) {
		w->seen = w->gen;
		w->last = dlock_clock_ms();
	}
	pthread_mutex_unlock(&nt->mu);
}

void dlock__rnotify_forget(dlock__rnotify *nt, const dlock_request *req)
{
	pthread_mutex_lock(&nt->mu);
	rn_waiter *w = waiter_find(nt, req);
	if (w)
		waiter_unlink(nt, w);
	pthread_mutex_unlock(&nt->mu);
}

/* The channels of one lock; owner (ours: "<client id>-<serial>") names the direct one. */
static rn_chan *chan_get(dlock__rnotify *nt, const char *name, const char *owner)
{
	size_t len = strlen(name);
	rn_chan *ch = chan_find(nt, name, len);
	if (ch)
		return ch;
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return NULL;
	ch->name = dlock__strdup(name);
	ch->len = len;
	size_t cid = strspn(owner, "0123456789abcdefABCDEF");
	if (cid > 0 && owner[cid] == '-') {
		ch->dlen = len + 1 + cid;
		if ((ch->direct = malloc(ch->dlen + 1)) != NULL)
			snprintf(ch->direct, ch->dlen + 1, "%s:%.*s", name, (int)cid, owner);
		else
			ch->dlen = 0; /* then only the lock's channel: wake-ups naming us come after a nap */
	}
	ch->sent = calloc(nt->n, 1);
	ch->pend = calloc(nt->n, sizeof(int));
	ch->ok = calloc(nt->n, 1);
	ch->heard = calloc(nt->n, 1);
	if (!ch->name || !ch->sent || !ch->pend || !ch->ok || !ch->heard) {
		chan_free(ch);
		return NULL;
	}
	ch->next = nt->chans;
	nt->chans = ch;
	return ch;
}

int dlock__rnotify_wait(dlock__rnotify *nt, dlock_request *req, const char *channel, int64_t timeout_ms)
{
	int64_t deadline = dlock_clock_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	pthread_mutex_lock(&nt->mu);
	if (!nt->started) {
		if (pthread_create(&nt->th, NULL, notify_main, nt) != 0) {
			pthread_mutex_unlock(&nt->mu);
			dlock__sleep_ms(timeout_ms); /* cannot listen: behave like a back-off */
			return 0;
		}
		nt->started = true;
	}
	rn_waiter *w = waiter_find(nt, req);
	if (w && strcmp(w->chan->name, channel) != 0) { /* a handle reused for another name */
		waiter_unlink(nt, w);
		w = NULL;
	}
	bool first = !w;
	if (!w) {
		rn_chan *ch = chan_get(nt, channel, req->owner);
		w = ch ? calloc(1, sizeof(*w)) : NULL;
		if (!w) {
			pthread_mutex_unlock(&nt->mu);
			dlock__sleep_ms(timeout_ms);
			return 0;
		}
		w->req = req;
		w->chan = ch;
		ch->refs++;
		w->next = nt->waiters;
		nt->waiters = w;
		kick(nt);
	}
	snprintf(w->owner, sizeof(w->owner), "%s", req->owner);
	w->inwait++;
	struct timespec ts;
	if (first || !chan_ok(nt, w->chan)) {
		/* not listening yet: wait for the subscription, then let the core try again */
		while (!chan_ok(nt, w->chan) && !nt->stop && dlock_clock_ms() < deadline) {
			dlock__abstime(&ts, deadline - dlock_clock_ms());
			pthread_cond_timedwait(&nt->cv, &nt->mu, &ts);
		}
	} else {
		while (w->gen == w->seen && !nt->stop && dlock_clock_ms() < deadline) {
			dlock__abstime(&ts, deadline - dlock_clock_ms());
			pthread_cond_timedwait(&nt->cv, &nt->mu, &ts);
		}
	}
	w->inwait--;
	w->last = dlock_clock_ms();
	pthread_mutex_unlock(&nt->mu);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* the redis:// backend                                                      */
/* ------------------------------------------------------------------------ */

/* Releases sent without waiting for their replies (release=pipelined). */
#define PIPELINE_MAX 16
typedef struct rpending {
	char key[DLOCK__REDIS_KEY_MAX];
	char owner[DLOCK__OWNER_MAX];
} rpending;

typedef struct rstore {
	dlock_backend base;
	dlock__rserver *srv; /* one */
	size_t nsrv;
	char *user, *password;
	char *prefix;
	redisContext *c;     /* non-blocking socket; every wait bounded by the call's deadline */
	char sha[DLOCK__RS_COUNT][41];
	dlock__rnotify *nt;
	bool retried;        /* the last run_argv sent its command a second time */
	dlock__rserver *sentinels; /* redis+sentinel://: where to ask for the master */
	size_t nsentinels;
	char *master_name;
	bool pipelined;      /* release=pipelined */
	rpending *pend;      /* [PIPELINE_MAX]: sent, reply not read yet, in order */
	size_t npend;
	rpending *again;     /* [PIPELINE_MAX]: answered NOSCRIPT, to send again */
	size_t nagain;
	int wait_replicas;   /* a grant returns only once on this many replicas (WAIT) */
	int fence_replicas;  /* fence guard: reservations go to this many replicas; 0 = off */
	char server_id[48];  /* run_id of the server s->c talks to (fence guard) */
} rstore;

static void drop(rstore *s)
{
	if (s->c)
		redisFree(s->c);
	s->c = NULL;
	s->npend = 0; /* pipelined releases whose fate is unknown: they end with their leases */
}

/* A request that ran out of time: the message says so (the contract's "timed out"). */
static int timed_out_error(int rc, const char *what)
{
	/* a refused reply, or a connection the server refused, did not time out */
	if (rc == DLOCK_EUNAVAILABLE && !strstr(dlock_error_last()->message, "timed out") &&
	    strcmp(dlock_error_last()->store_code, "EPROTO") != 0 &&
	    strcmp(dlock_error_last()->store_code, "ECONN") != 0)
		return rewrap(rc, KIND, what);
	return rc;
}

/*
 * redis+sentinel://: ask the sentinels, in order, where the master named in
 * the URI is (each gets a fair share of the time left, so one hung sentinel
 * does not use it all).
 */
static int sentinel_resolve(rstore *s, int64_t deadline)
{
	int rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "no sentinel answered with the address of master '%s'",
				 s->master_name);
	for (size_t i = 0; i < s->nsentinels; i++) {
		int64_t left = ms_left(deadline);
		if (left <= 0)
			break;
		int64_t share = left / (int64_t)(s->nsentinels - i);
		if (share < 100)
			share = left < 100 ? left : 100;
		int64_t until = dlock_clock_ms() + share;
		dlock__rserver q = s->sentinels[i];
		q.user = q.password = NULL; /* sentinels without AUTH (see docs) */
		q.db = 0;
		redisContext *c = NULL;
		if (dlock__rconnect_by(&c, &q, KIND, until) != 0)
			continue;
		const char *argv[3] = { "SENTINEL", "get-master-addr-by-name", s->master_name };
		redisAppendCommandArgv(c, 3, argv, NULL);
		redisReply *r = NULL;
		bool ok = dlock__rread_by(c, &q, KIND, until, &r) == 0 && r->type == REDIS_REPLY_ARRAY &&
			  r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
			  r->element[1]->type == REDIS_REPLY_STRING;
		if (ok)
			dlock__rnotify_moved(s->nt, 0, r->element[0]->str, atoi(r->element[1]->str));
		if (r)
			freeReplyObject(r);
		redisFree(c);
		if (ok)
			return 0;
	}
	return rc;
}

/* Connect to the master the sentinels named and check that it is one (ROLE):
 * during a failover the old address may still answer, as a replica. */
static int connect_master(rstore *s, int64_t deadline)
{
	int rc = dlock__rconnect_by(&s->c, &s->srv[0], KIND, deadline);
	if (rc)
		return rc;
	redisReply *r = NULL;
	redisAppendCommand(s->c, "ROLE");
	if ((rc = dlock__rread_by(s->c, &s->srv[0], KIND, deadline, &r)) != 0) {
		drop(s);
		return rc;
	}
	bool master = r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING &&
		      !strcmp(r->element[0]->str, "master");
	freeReplyObject(r);
	if (!master) {
		drop(s);
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "READONLY",
				       "%s:%d, named master '%s' by the sentinels, is not a master (failover in progress?)",
				       s->srv[0].host, s->srv[0].port, s->master_name);
	}
	return 0;
}

/*
 * (Re)connect the command connection by the deadline. Through the sentinels
 * when configured, asking them again until a master answers or the time is
 * up: during a failover the old master refuses or is a replica, and the
 * sentinels name the new one a moment later.
 */
/* The fence guard names the server it talks to: its run_id, new for every
 * process, so a promoted replica or a restarted server differs. */
static int fetch_server_id(rstore *s, int64_t deadline)
{
	s->server_id[0] = 0;
	if (!s->fence_replicas)
		return 0;
	redisReply *r = NULL;
	redisAppendCommand(s->c, "INFO server");
	int rc = dlock__rread_by(s->c, &s->srv[0], KIND, deadline, &r);
	if (rc) {
		drop(s);
		return rc;
	}
	const char *p = r->type == REDIS_REPLY_STRING ? strstr(r->str, "run_id:") : NULL;
	if (p)
		snprintf(s->server_id, sizeof(s->server_id), "%.*s", (int)strcspn(p + 7, "\r\n"), p + 7);
	freeReplyObject(r);
	if (!s->server_id[0]) {
		drop(s);
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "%s:%d: INFO server has no run_id (fence guard)",
				       s->srv[0].host, s->srv[0].port);
	}
	return 0;
}

static int connect_cmd(rstore *s, int64_t deadline)
{
	if (!s->sentinels) {
		int rc = dlock__rconnect_by(&s->c, &s->srv[0], KIND, deadline);
		if (!rc)
			rc = fetch_server_id(s, deadline);
		return timed_out_error(rc, "timed out: ");
	}
	int rc;
	char last[400] = ""; /* what the master named last said: the best explanation */
	for (;;) {
		rc = sentinel_resolve(s, deadline);
		if (!rc && (rc = connect_master(s, deadline)) == 0 && (rc = fetch_server_id(s, deadline)) == 0)
			return 0;
		if (rc != DLOCK_EUNAVAILABLE)
			return rc;
		if (s->srv[0].port)
			snprintf(last, sizeof(last), "%s", dlock_error_last()->message);
		int64_t left = ms_left(deadline);
		if (left <= 0)
			break;
		dlock__sleep_ms(left < 50 ? left : 50);
	}
	if (last[0])
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ETIMEDOUT",
				       "timed out finding the master '%s' through the sentinels (last: %s)", s->master_name,
				       last);
	return timed_out_error(rc, "timed out finding the master through the sentinels: ");
}

/*
 * Read the replies of the pipelined releases, which come before the reply of
 * anything sent after them. A release the server did not run because its
 * script cache was flushed (NOSCRIPT) goes to s->again, for resend_releases.
 * @return 0; an error when the connection broke or the deadline passed (then
 * the caller drops it): a release that did not reach the server ends with
 * its lease.
 */
static int read_pending(rstore *s, int64_t deadline)
{
	size_t n = s->npend;
	s->npend = 0;
	for (size_t i = 0; i < n; i++) {
		redisReply *r = NULL;
		int rc = dlock__rread_by(s->c, &s->srv[0], KIND, deadline, &r);
		if (rc)
			return rc;
		if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8) && s->nagain < PIPELINE_MAX)
			s->again[s->nagain++] = s->pend[i];
		/* any other answer needs nothing: 0 = the hold had already ended */
		freeReplyObject(r);
	}
	return 0;
}

/* Send one command and read its reply by the deadline, after the replies of
 * the pipelined releases sent before it: they share one round trip. */
static int exchange(rstore *s, int argc, const char **argv, const size_t *lens, int64_t deadline,
		    redisReply **out)
{
	*out = NULL;
	if (redisAppendCommandArgv(s->c, argc, argv, lens) != REDIS_OK)
		return dlock__oom();
	int rc = read_pending(s, deadline);
	return rc ? rc : dlock__rread_by(s->c, &s->srv[0], KIND, deadline, out);
}

static redisReply *run_argv(rstore *s, int script, int argc, const char **argv, size_t *lens, int64_t deadline,
			    int *rc);

/* Send again, confirmed this time, the pipelined releases that met a flushed script cache. */
static void resend_releases(rstore *s, int64_t deadline)
{
	while (s->nagain) {
		rpending p = s->again[--s->nagain];
		const char *argv[5] = { NULL, NULL, "1", p.key, p.owner };
		size_t lens[5] = { 0, 0, 1, strlen(p.key), strlen(p.owner) };
		int rc;
		redisReply *r = run_argv(s, DLOCK__RS_RELEASE, 5, argv, lens, deadline, &rc);
		if (r)
			freeReplyObject(r);
	}
}

/* Before using the connection for anything but a script: the pipelined
 * releases' replies first. */
static void settle(rstore *s, int64_t deadline)
{
	if (s->c && s->npend && read_pending(s, deadline) != 0)
		drop(s);
	resend_releases(s, deadline);
}

/*
 * Run a script by the deadline: EVALSHA, EVAL on NOSCRIPT (a restarted or
 * flushed server; EVAL also caches it again). A connection found dead (the
 * server restarted since our last call) is replaced and the call tried once
 * more, if time is left — every script is safe to repeat: acquire returns the
 * same grant to the same owner (with its expiry refreshed), release/renew/
 * cancel are owner-checked. A timeout is not retried: the connection is
 * dropped (a late reply must never answer a later request) and the caller
 * gets DLOCK_EUNAVAILABLE "timed out"; the next call reconnects.
 * Returns the reply (caller frees) or NULL with the error set in *rc.
 */
static redisReply *run_argv(rstore *s, int script, int argc, const char **argv, size_t *lens, int64_t deadline,
			    int *rc)
{
	bool eval = !s->sha[script][0];
	s->retried = false;
	if (ms_left(deadline) < 3) { /* too late to start: nothing sent, no late reply to fear */
		*rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ETIMEDOUT", "%s %s:%d: timed out before the request was sent",
				      KIND, s->srv[0].host, s->srv[0].port);
		return NULL;
	}
	for (int attempt = 0; attempt < 2; attempt++) {
		s->retried = attempt > 0;
		bool fresh = false;
		if (!s->c) {
			if ((*rc = connect_cmd(s, deadline)) != 0)
				return NULL;
			fresh = true;
		}
		redisReply *r = NULL;
		for (;;) {
			argv[0] = eval ? "EVAL" : "EVALSHA";
			argv[1] = eval ? dlock__rscript_text[script] : s->sha[script];
			lens[0] = strlen(argv[0]);
			lens[1] = strlen(argv[1]);
			*rc = exchange(s, argc, argv, lens, deadline, &r);
			if (!*rc && !eval && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8)) {
				freeReplyObject(r);
				r = NULL;
				eval = true;
				continue;
			}
			break;
		}
		if (r && r->type == REDIS_REPLY_ERROR && s->sentinels && !strncmp(r->str, "READONLY", 8) && !fresh) {
			/* our master was demoted (failover): ask the sentinels again */
			freeReplyObject(r);
			drop(s);
			continue;
		}
		if (r) {
			if (r->type == REDIS_REPLY_ERROR) {
				*rc = dlock__rreply_error(r, &s->srv[0], KIND);
				freeReplyObject(r);
				return NULL;
			}
			*rc = 0;
			if (s->nagain) {
				bool retried = s->retried;
				resend_releases(s, deadline);
				s->retried = retried;
			}
			return r;
		}
		bool timeout = !strcmp(dlock_error_last()->store_code, "ETIMEDOUT");
		drop(s);
		if (fresh || timeout || *rc == DLOCK_ENOMEM || ms_left(deadline) <= 0) {
			if (timeout)
				*rc = timed_out_error(*rc, "timed out: ");
			return NULL;
		}
	}
	return NULL;
}

static redisReply *run(rstore *s, int script, dlock__rargs *a, int64_t deadline, int *rc)
{
	return run_argv(s, script, a->argc, a->argv, a->lens, deadline, rc);
}

static rstore *RS(dlock_backend *be)
{
	return (rstore *)be;
}

static const char confirm_lua[] =
	"local E = KEYS[1] .. ':e'\n"
	"if redis.call('HGET', E, 'id') == ARGV[2] and tonumber(redis.call('HGET', E, 'c') or '0') < tonumber(ARGV[1]) then\n"
	"  redis.call('HSET', E, 'c', ARGV[1])\n"
	"end\n"
	"return 1\n";

/*
 * After a grant: wait until the replicas have it (wait_replicas), or have the
 * fence reservation it made (reserve > 0; then confirm the reservation).
 * Otherwise give the grant back: a grant or a fence that a failover can lose
 * is not handed out. @return 0; DLOCK_EUNAVAILABLE.
 */
static int replicate_grant(rstore *s, dlock_request *req, const dlock__rkeys *k, long long reserve, int64_t deadline)
{
	int n = s->wait_replicas;
	if (reserve > 0 && s->fence_replicas > n)
		n = s->fence_replicas;
	if (n <= 0)
		return 0;
	int64_t left = ms_left(deadline);
	int64_t margin = left / 5 > 10 ? left / 5 : 10; /* for the reply to come back in time */
	long long acked = -1;
	int rc = 0;
	if (left - margin >= 1) {
		char num[16], ms[24];
		snprintf(num, sizeof(num), "%d", n);
		snprintf(ms, sizeof(ms), "%lld", (long long)(left - margin));
		const char *argv[3] = { "WAIT", num, ms };
		redisReply *r = NULL;
		redisAppendCommandArgv(s->c, 3, argv, NULL);
		if ((rc = dlock__rread_by(s->c, &s->srv[0], KIND, deadline, &r)) != 0) {
			drop(s);
			return timed_out_error(rc, "timed out waiting for the replicas: ");
		}
		if (r->type == REDIS_REPLY_INTEGER)
			acked = r->integer;
		freeReplyObject(r);
	}
	if (acked >= n) {
		if (reserve > 0) { /* best effort: unconfirmed, the next grant waits again */
			char rv[24];
			snprintf(rv, sizeof(rv), "%lld", reserve);
			const char *argv[6] = { "EVAL", confirm_lua, "1", k->k[DLOCK__RK_H], rv, s->server_id };
			size_t lens[6] = { 4, sizeof(confirm_lua) - 1, 1, k->len[DLOCK__RK_H], strlen(rv),
					   strlen(s->server_id) };
			redisReply *r = NULL;
			redisAppendCommandArgv(s->c, 6, argv, lens);
			if (dlock__rread_by(s->c, &s->srv[0], KIND, deadline, &r) != 0)
				drop(s);
			else
				freeReplyObject(r);
		}
		return 0;
	}
	/* give it back (the core undoes it again if this does not arrive) */
	dlock__rargs a;
	dlock__rargs_owner(&a, k, req);
	redisReply *r = run(s, DLOCK__RS_RELEASE, &a, deadline, &rc);
	if (r)
		freeReplyObject(r);
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "NOREPLICAS",
			       "lock '%s': the grant reached %lld of %d replica(s) in time; given back%s", req->name,
			       acked < 0 ? 0 : acked, n, acked < 0 ? " (timed out)" : "");
}

static int r_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	rstore *s = RS(be);
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_acquire(&a, &k, req, 0);
	int64_t deadline = req->deadline_ms;
	dlock__rnotify_arm(s->nt, req);
	if (dlock_try_too_late(req, s->srv[0].timeout_ms)) /* see "Time" in sys/backend.h */
		return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "lock '%s' not acquired by the end of the wait",
				       req->name);
	int rc;
	redisReply *r = NULL;
	if (s->fence_replicas) {
		/* ARGV[8]: the server's id, read when connecting: connect first */
		if (!s->c && (rc = connect_cmd(s, deadline)) != 0)
			return rc;
		arg_s(&a, s->server_id);
	}
	r = run(s, DLOCK__RS_ACQUIRE, &a, deadline, &rc);
	if (!r)
		return rc;
	rc = dlock__racquire_reply(r, fence, retry_ms, KIND);
	long long reserve = 0;
	if (rc == 0 && r->elements == 3)
		reply_int(r->element[2], &reserve);
	freeReplyObject(r);
	if (rc == 0 && (s->wait_replicas > 0 || reserve > 0) && s->c)
		rc = replicate_grant(s, req, &k, reserve, deadline);
	else if (rc == 0 && !s->c && (s->wait_replicas > 0 || reserve > 0))
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "lock '%s': connection lost before WAIT", req->name);
	dlock__racquire_done(req, rc);
	if (rc == 0)
		dlock__rnotify_forget(s->nt, req);
	return rc;
}

/*
 * release=pipelined: write the release and return without its reply; the
 * next command on the connection reads it (exchange). The script still checks
 * the owner; what the caller gives up is the answer ("was it still ours?").
 * @return false when it could not be sent (no connection): confirm instead.
 */
static bool send_release(rstore *s, dlock__rargs *a, int64_t deadline)
{
	if (s->npend == PIPELINE_MAX || !s->sha[DLOCK__RS_RELEASE][0])
		settle(s, deadline);
	if (!s->c || !s->sha[DLOCK__RS_RELEASE][0])
		return false;
	a->argv[0] = "EVALSHA";
	a->argv[1] = s->sha[DLOCK__RS_RELEASE];
	a->lens[0] = 7;
	a->lens[1] = 40;
	if (redisAppendCommandArgv(s->c, a->argc, a->argv, a->lens) != REDIS_OK)
		return false;
	if (io_flush(s->c, deadline) != IO_OK) {
		drop(s); /* unknown whether it arrived: the confirmed path sends it again */
		return false;
	}
	rpending *p = &s->pend[s->npend++];
	snprintf(p->key, sizeof(p->key), "%.*s", (int)a->lens[3], a->argv[3]);
	snprintf(p->owner, sizeof(p->owner), "%.*s", (int)a->lens[4], a->argv[4]);
	return true;
}

static int r_release(dlock_backend *be, dlock_request *req)
{
	rstore *s = RS(be);
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	dlock__rnotify_forget(s->nt, req);
	if (s->pipelined && !req->confirm && send_release(s, &a, req->deadline_ms))
		return 0;
	int rc;
	redisReply *r = run(s, DLOCK__RS_RELEASE, &a, req->deadline_ms, &rc);
	if (!r)
		return rc;
	long long v = 0;
	rc = reply_int(r, &v) ? bad_reply(KIND, "release") : 0;
	freeReplyObject(r);
	/* "not held" after a resend: the first send most likely released it before the
	 * connection broke (or the lease had ended: either way it is not held) */
	if (!rc && v != 1 && !s->retried)
		rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by %s", req->name, req->owner);
	return rc;
}

static int r_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	rstore *s = RS(be);
	if (n == 0)
		return 0;
	dlock__rbatch b;
	int rc = dlock__rbatch_renew(&b, s->prefix, reqs, n);
	if (rc)
		return rc;
	redisReply *r = run_argv(s, DLOCK__RS_RENEW, b.argc, b.argv, b.lens, reqs[0]->deadline_ms, &rc);
	dlock__rbatch_free(&b);
	if (!r)
		return rc;
	rc = dlock__rrenew_reply(r, n, results, KIND);
	freeReplyObject(r);
	return rc;
}

static int r_extend(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	dlock_request copy = *req;
	copy.ttl_ms = ttl_ms;
	dlock_request *one = &copy;
	int result = 0;
	int rc = r_renew(be, &one, 1, &result);
	if (rc)
		return rc;
	if (result)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by %s", req->name,
				       req->owner);
	return 0;
}

static int r_wait(dlock_backend *be, dlock_request *req, int64_t timeout_ms)
{
	rstore *s = RS(be);
	dlock__rkeys k;
	dlock__rkeys_make(&k, s->prefix, req->name);
	return dlock__rnotify_wait(s->nt, req, k.k[DLOCK__RK_C], timeout_ms);
}

static int r_cancel(dlock_backend *be, dlock_request *req)
{
	rstore *s = RS(be);
	dlock__rnotify_forget(s->nt, req);
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	req->slot = NULL;
	int rc;
	redisReply *r = run(s, DLOCK__RS_CANCEL, &a, req->deadline_ms, &rc);
	if (r)
		freeReplyObject(r);
	return r ? 0 : rc;
}

static int status_one(rstore *s, const char *name, int64_t deadline, dlock_lock_status **out, size_t *count)
{
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, name);
	dlock__rargs_status(&a, &k);
	int rc;
	redisReply *r = run(s, DLOCK__RS_STATUS, &a, deadline, &rc);
	if (!r)
		return rc;
	rc = dlock__rstatus_decode(r, name, out, count, KIND);
	freeReplyObject(r);
	return rc;
}

/* Escape glob characters of the prefix for SCAN MATCH. */
static void glob_escape(char *out, size_t cap, const char *s)
{
	size_t o = 0;
	for (; *s && o + 3 < cap; s++) {
		if (strchr("*?[]\\", *s))
			out[o++] = '\\';
		out[o++] = *s;
	}
	out[o] = 0;
}

/* Every name with holders or waiters: SCAN "{prefix:*", take holder hashes and
 * waiter sets. deadline > 0 bounds the whole scan (a connection made here is
 * non-blocking); 0: each SCAN gets srv->timeout_ms (blocking connection). */
static int scan_names(redisContext **cp, const dlock__rserver *srv, const char *prefix, const char *kind,
		      char ***names_io, size_t *n_io, int64_t deadline)
{
	char pat[2 * DLOCK__REDIS_PREFIX_MAX + 8], esc[2 * DLOCK__REDIS_PREFIX_MAX + 4];
	char pe[DLOCK__REDIS_PREFIX_MAX + 1];
	size_t plen = dlock__rprefix_enc(pe, sizeof(pe), prefix) + 2; /* "{prefix:" */
	glob_escape(esc, sizeof(esc), pe);
	snprintf(pat, sizeof(pat), "{%s:*", esc);
	char **names = *names_io;
	size_t n = *n_io, cap = n;
	char cursor[32] = "0";
	int rc = 0;
	do {
		int64_t until = deadline > 0 ? deadline : dlock_clock_ms() + srv->timeout_ms;
		if (!*cp && (rc = deadline > 0 ? dlock__rconnect_by(cp, srv, kind, until)
					      : dlock__rconnect(cp, srv, kind)) != 0)
			break;
		const char *argv[6] = { "SCAN", cursor, "MATCH", pat, "COUNT", "1000" };
		redisReply *r = NULL;
		redisAppendCommandArgv(*cp, 6, argv, NULL);
		if ((rc = dlock__rread_by(*cp, srv, kind, until, &r)) != 0) {
			redisFree(*cp);
			*cp = NULL;
			break;
		}
		if (r->type == REDIS_REPLY_ERROR || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
		    r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
			rc = r->type == REDIS_REPLY_ERROR ? dlock__rreply_error(r, srv, kind)
							  : bad_reply(kind, "SCAN");
			freeReplyObject(r);
			break;
		}
		snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
		for (size_t i = 0; i < r->element[1]->elements && !rc; i++) {
			const redisReply *e = r->element[1]->element[i];
			if (e->type != REDIS_REPLY_STRING || e->len <= plen + 1)
				continue;
			size_t end;
			if (e->str[e->len - 1] == '}')
				end = e->len - 1;
			else if (e->len > plen + 3 && !strcmp(e->str + e->len - 3, "}:w"))
				end = e->len - 3;
			else
				continue;
			if (end <= plen || memchr(e->str, 0, e->len))
				continue;
			if (n == cap) {
				cap = cap ? cap * 2 : 16;
				char **nn = realloc(names, cap * sizeof(*names));
				if (!nn) {
					rc = dlock__oom();
					break;
				}
				names = nn;
			}
			if (!(names[n] = dlock__strndup(e->str + plen, end - plen)))
				rc = DLOCK_ENOMEM;
			else
				n++;
		}
		freeReplyObject(r);
	} while (!rc && strcmp(cursor, "0") != 0);
	*names_io = names;
	*n_io = n;
	return rc;
}

int dlock__rscan_names(redisContext **cp, const dlock__rserver *srv, const char *prefix, const char *kind,
		       char ***names, size_t *n)
{
	return scan_names(cp, srv, prefix, kind, names, n, 0);
}

int dlock__rscan_names_by(redisContext **cp, const dlock__rserver *srv, const char *prefix, const char *kind,
			  char ***names, size_t *n, int64_t deadline)
{
	return scan_names(cp, srv, prefix, kind, names, n, deadline > 0 ? deadline : 1);
}

/* The core lists through r_list, so names is never NULL here. Bounded by the
 * request timeout from the call (the contract's bound for status). */
static int r_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		    size_t *count)
{
	rstore *s = RS(be);
	int64_t deadline = dlock_clock_ms() + s->srv[0].timeout_ms;
	for (size_t i = 0; i < nnames; i++) {
		int rc = status_one(s, names[i], deadline, out, count);
		if (rc)
			return rc;
	}
	return 0;
}

static int r_list(dlock_backend *be, char ***names, size_t *n)
{
	rstore *s = RS(be);
	int64_t deadline = dlock_clock_ms() + s->srv[0].timeout_ms;
	settle(s, deadline);
	int rc = s->c ? 0 : connect_cmd(s, deadline);
	if (!rc)
		rc = dlock__rscan_names_by(&s->c, &s->srv[0], s->prefix, KIND, names, n, deadline);
	if (rc)
		rc = timed_out_error(rc, ms_left(deadline) <= 0 ? "timed out: " : "");
	return rc;
}

static void r_close(dlock_backend *be)
{
	rstore *s = RS(be);
	if (!s)
		return;
	if (s->pend && s->c)
		settle(s, dlock_clock_ms() + s->srv[0].timeout_ms); /* confirm what is pipelined first */
	dlock__rnotify_free(s->nt);
	drop(s);
	free(s->pend);
	free(s->again);
	free(s->srv);
	free(s->sentinels);
	free(s->master_name);
	free(s->user);
	free(s->password);
	free(s->prefix);
	free(s);
}

/* SCRIPT LOAD everything in one pipelined round trip; EVALSHA from then on. */
static int load_scripts(rstore *s, int64_t deadline)
{
	for (int i = 0; i < DLOCK__RS_COUNT; i++) {
		const char *argv[3] = { "SCRIPT", "LOAD", dlock__rscript_text[i] };
		redisAppendCommandArgv(s->c, 3, argv, NULL);
	}
	int rc = 0;
	for (int i = 0; i < DLOCK__RS_COUNT; i++) {
		redisReply *r = NULL;
		int e = dlock__rread_by(s->c, &s->srv[0], KIND, deadline, &r);
		if (e) {
			drop(s);
			return timed_out_error(e, "timed out: ");
		}
		if (r->type == REDIS_REPLY_STRING && r->len == 40)
			memcpy(s->sha[i], r->str, 41);
		else if (r->type == REDIS_REPLY_ERROR && !rc)
			rc = dlock__rreply_error(r, &s->srv[0], KIND);
		freeReplyObject(r);
	}
	return rc;
}

/* A hold is keys in the server, keyed by owner: the renewer renews from an
 * instance (connection) of its own, never behind a caller's request. */
static const dlock_backend_methods redis_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.flags = DLOCK_BACKEND_F_RENEW_APART,
	.acquire = r_acquire,
	.release = r_release,
	.renew = r_renew,
	.extend = r_extend,
	.wait = r_wait,
	.cancel = r_cancel,
	.status = r_status,
	.list = r_list,
	.close = r_close,
};

int dlock__redis_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	int64_t deadline = dlock_clock_ms() + uri->connect_timeout_ms; /* the whole open */
	bool sentinel = !strcmp(uri->scheme, "redis+sentinel");
	/* redis+sentinel://s1:p1,s2:p2/MASTERNAME[/db] */
	char master[256] = "";
	const char *dbpath = uri->path;
	if (sentinel) {
		const char *p = uri->path && uri->path[0] == '/' ? uri->path + 1 : "";
		size_t len = strcspn(p, "/");
		if (!len || len >= sizeof(master))
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "redis+sentinel:// needs the master's name: "
					       "redis+sentinel://host:26379,host:26379/MASTERNAME[/db]");
		memcpy(master, p, len);
		master[len] = 0;
		dbpath = p + len;
	}
	dlock__rserver *srv = NULL;
	size_t n = 0;
	int rc = dlock__rserver_parse(&srv, &n, uri, KIND, sentinel ? 26379 : 6379, dbpath);
	if (rc)
		return rc;
	if (n != 1 && !sentinel) {
		free(srv);
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "redis:// takes exactly one host (got %zu); for several independent masters "
				       "use redlock://h1:p1,h2:p2,h3:p3",
				       n);
	}
	rstore *s = dlock__calloc(1, sizeof(*s));
	if (!s) {
		free(srv);
		return DLOCK_ENOMEM;
	}
	if (sentinel) { /* srv: the sentinels; s->srv: the master, found at connect */
		s->sentinels = srv;
		s->nsentinels = n;
		if (!(s->master_name = dlock__strdup(master)) || !(s->srv = dlock__calloc(1, sizeof(*s->srv))))
			goto oom;
		s->srv[0] = srv[0];
		s->srv[0].host[0] = 0;
		s->srv[0].port = 0;
	} else {
		s->srv = srv;
	}
	s->nsrv = 1;
	dlock_backend_init(&s->base, &redis_methods);
	/* the URI outlives nothing: keep our own copies of what srv borrows */
	if (uri->user && *uri->user && !(s->user = dlock__strdup(uri->user)))
		goto oom;
	if (uri->password && !(s->password = dlock__strdup(uri->password)))
		goto oom;
	if (!(s->prefix = dlock__strdup(uri->prefix)))
		goto oom;
	s->srv[0].user = s->user;
	s->srv[0].password = s->password;
	const char *rel = dlock_uri_param(uri, "release");
	if (rel && strcmp(rel, "confirmed") != 0 && strcmp(rel, "pipelined") != 0) {
		rc = dlock_error_set(DLOCK_EINVAL, KIND, NULL, "option release: want confirmed or pipelined, not '%s'",
				     rel);
		goto fail;
	}
	if (rel && !strcmp(rel, "pipelined")) {
		s->pipelined = true;
		if (!(s->pend = dlock__calloc(PIPELINE_MAX, sizeof(*s->pend))) ||
		    !(s->again = dlock__calloc(PIPELINE_MAX, sizeof(*s->again))))
			goto oom;
	}
	/* Sentinel: a failover must not lose a grant that was handed out, nor
	 * make a fence go back (see docs/stores/redis.md) */
	s->wait_replicas = s->fence_replicas = sentinel ? 1 : 0;
	const char *opt[2] = { "wait_replicas", "fence_replicas" };
	int *val[2] = { &s->wait_replicas, &s->fence_replicas };
	for (int i = 0; i < 2; i++) {
		const char *v = dlock_uri_param(uri, opt[i]);
		if (!v)
			continue;
		char *end;
		errno = 0;
		long x = strtol(v, &end, 10);
		if (errno || end == v || *end || x < 0 || x > 100) {
			rc = dlock_error_set(DLOCK_EINVAL, KIND, NULL, "option %s: want a number of replicas (0-100), not '%s'",
					     opt[i], v);
			goto fail;
		}
		*val[i] = (int)x;
	}
	if ((rc = dlock__rnotify_new(&s->nt, s->srv, 1, KIND)) != 0)
		goto fail;
	if ((rc = connect_cmd(s, deadline)) != 0)
		goto fail;
	if ((rc = load_scripts(s, deadline)) != 0)
		goto fail;
	*out = &s->base;
	return 0;
oom:
	rc = DLOCK_ENOMEM;
fail:
	if (!s->srv && !s->sentinels)
		free(srv);
	r_close(&s->base);
	return rc;
}
