/*
 * What the Redis store (redis.c) shares with the Redlock store (redlock.c):
 * server addresses and the connection handshake, reply decoding and the key
 * layout (protocol.c), the Lua scripts (scripts.c, from the files in lua/) and the
 * pub/sub notifier that wakes waiters (notify.c). redlock.c only adds the
 * parallel fan-out to N masters and the quorum rules.
 *
 * Key layout of one lock NAME under prefix P (all share the hash tag {P:NAME},
 * so Redis Cluster keeps them in one slot). P is written escaped
 * (dlock__rprefix_enc: ':' '%' '{' '}' as %3A %25 %7B %7D) so that no two
 * (prefix, name) pairs share a key; a prefix without them is written as is.
 *
 *   {P:NAME}     HASH  holders: field owner -> "expiry_ms fence mode permits pid host"
 *                      (expiry on the server's clock, mode 'x' or 's'). Key TTL >=
 *                      the latest holder expiry, so an absent key means "free";
 *                      Redis drops the hash with its last holder.
 *   {P:NAME}:f   STRING fence counter (INCR per grant; never expires or deleted)
 *   {P:NAME}:e   HASH  fence guard (fence_replicas): id = the epoch of the server
 *                      that last granted ("run_id master_replid", read by the
 *                      script: new on every restart and every promotion),
 *                      r = fences reserved (on the replicas before use),
 *                      c = reservation confirmed replicated; never expires
 *   {P:NAME}:w   ZSET  waiters: owner -> registration deadline (server ms)
 *   {P:NAME}:q   ZSET  fair queue: owner -> ticket (arrival time in us); dead heads pruned
 *   {P:NAME}:x   ZSET  waiting writers (exclusive waiters): blocks new readers
 *   {P:NAME}:c   pub/sub channel: "*<releasing owner>" wakes every waiter
 *                (readers wait; the owner lets a Redlock client drop the copies
 *                from the other masters). Nothing when nobody waits.
 *   {P:NAME}:c:<client id>  pub/sub channel of one client (store handle):
 *                the owner token of the one waiter to wake (the fair queue's
 *                head; without a queue, the longest-registered live waiter
 *                when only writers wait).
 */
#ifndef DLOCK_STORES_REDIS_H
#define DLOCK_STORES_REDIS_H

#include "../support.h"

#include <hiredis/hiredis.h>

/* Longest prefix accepted: keeps every key in a fixed buffer. */
#define DLOCK__REDIS_PREFIX_MAX 200
#define DLOCK__REDIS_KEY_MAX (DLOCK__REDIS_PREFIX_MAX + DLOCK_NAME_MAX + 8)

/* TLS settings of a store (tls.c): NULL for plain TCP. */
typedef struct dlock__rtls dlock__rtls;

/* One Redis server and how to log in to it. */
typedef struct dlock__rserver {
	char host[256];
	int port;
	dlock__rtls *tls;       /* NULL: plain TCP */
	bool tls_owner;         /* element 0 of what dlock__rserver_parse made: frees tls */
	const char *user;       /* borrowed from the store; NULL when absent */
	const char *password;   /* borrowed; NULL when absent; never printed */
	int db;
	int64_t connect_timeout_ms;
	int64_t timeout_ms;     /* per command (read/write) */
} dlock__rserver;

/*
 * Parse what redis:// and redlock:// share: hosts (default_port when absent),
 * user/password, database from dbpath ("/db" or ""), option `timeout` (command timeout, default 2 s
 * or connect_timeout if smaller), and TLS (rediss://, or tls=yes: options
 * cacert, cert, key, sni, insecure; tls.c). *out (of *n) is freed with
 * dlock__rservers_free.
 */
int dlock__rserver_parse(dlock__rserver **out, size_t *n, dlock_uri *uri, const char *kind, int default_port,
			 const char *dbpath);

/* ---- TLS (tls.c) ---- */
/* The TLS settings of uri into *out (NULL without TLS). @return 0; DLOCK_EINVAL. */
int dlock__rtls_parse(dlock__rtls **out, dlock_uri *uri, const char *kind);
void dlock__rtls_free(dlock__rtls *t);
/* Free what dlock__rserver_parse made (and its TLS settings). */
void dlock__rservers_free(dlock__rserver *s);
/* After the TCP connect: the TLS handshake of srv (nothing without srv->tls),
 * the server's certificate checked against the CA and srv's host (or sni=),
 * bounded by deadline. @return 0; DLOCK_EUNAVAILABLE (naming the reason). */
int dlock__rtls_connect(redisContext *c, const dlock__rserver *srv, const char *kind, int64_t deadline);
/* The same handshake in steps, for a poll loop over several connections
 * (Redlock): begin puts c's socket in non-blocking mode and gives c its
 * session (0, or DLOCK_ENOMEM); step drives it: 0 done, 1 wait for *events
 * on c->fd, else the error set (naming the reason). On failure the caller
 * frees c with dlock__rfree. */
int dlock__rtls_begin(redisContext *c, const dlock__rserver *srv);
int dlock__rtls_step(redisContext *c, const dlock__rserver *srv, const char *kind, short *events);
/* redisBufferWrite, through the context's TLS session when it has one:
 * every write of a context goes through this. */
int dlock__rbuffer_write(redisContext *c, int *done);
/* dlock__rbuffer_read's TLS half: *tls says whether c has a session (if not,
 * nothing was done). */
int dlock__rtls_read(redisContext *c, bool *tls);
/* redisFree, and the context's TLS session with it: every context is freed so. */
void dlock__rfree(redisContext *c);

/* Blocking connect + AUTH + SELECT. @return 0; EUNAVAILABLE; EAUTH; EINVAL (bad db). */
int dlock__rconnect(redisContext **out, const dlock__rserver *srv, const char *kind);

/*
 * The same, bounded by `deadline` (CLOCK_MONOTONIC ms, dlock_clock_ms) for the
 * whole handshake; the TCP connect also by srv->connect_timeout_ms. The
 * socket is left NON-BLOCKING, with keepalive and TCP_USER_TIMEOUT: use the
 * context only through redisAppendCommand* + dlock__rread_by (never the
 * blocking redisCommand/redisGetReply). @return as dlock__rconnect; a
 * timeout is DLOCK_EUNAVAILABLE with store code "ETIMEDOUT".
 */
int dlock__rconnect_by(redisContext **out, const dlock__rserver *srv, const char *kind, int64_t deadline);

/*
 * Write what is appended on c, then read the next reply, by `deadline`
 * (poll before every read and write; blocking sockets work too, for short
 * commands). @return 0 and *out (caller frees); DLOCK_EUNAVAILABLE when the
 * connection broke or the deadline passed (store code "ETIMEDOUT"): then the
 * caller must redisFree(c), so that no late reply answers a later request.
 */
int dlock__rread_by(redisContext *c, const dlock__rserver *srv, const char *kind, int64_t deadline, redisReply **out);

/* Write what is appended on c by `deadline`, without reading a reply
 * (a pipelined command). @return 0; -1 (broken or timed out: drop c). */
int dlock__rflush_by(redisContext *c, int64_t deadline);

/*
 * Bounds of one reply, against a hostile or broken server (hiredis would
 * allocate whatever a header announces): unparsed bytes buffered, and the
 * elements of all arrays of one reply. A legitimate reply (a renew batch,
 * a SCAN page, a status) is far below both.
 */
#define DLOCK__REDIS_REPLY_MAX_BYTES (16u << 20)
#define DLOCK__REDIS_REPLY_MAX_ELEMENTS (1u << 20)

/*
 * redisBufferRead and redisGetReplyFromReader within those bounds: every read
 * of a context goes through these two. Over a bound they fail with c->err =
 * REDIS_ERR_PROTOCOL and a "reply refused: ..." c->errstr (store code
 * "EPROTO" from dlock__rconn_error); the caller drops the connection.
 */
int dlock__rbuffer_read(redisContext *c);
int dlock__rget_reply(redisContext *c, void **reply);

/* TCP keepalive (idle about timeout_ms) and TCP_USER_TIMEOUT on c's socket
 * (dlock__rconnect() and dlock__rconnect_by() already do it). */
void dlock__rsock_setup(redisContext *c, int64_t timeout_ms);

/* Turn a Redis error reply into a dlock error (EAUTH, ESTORE, ...). */
int dlock__rreply_error(const redisReply *r, const dlock__rserver *srv, const char *kind);

/* Turn a broken context (c->err) into DLOCK_EUNAVAILABLE naming the server. */
int dlock__rconn_error(const redisContext *c, const dlock__rserver *srv, const char *kind);

/* Milliseconds left until deadline (CLOCK_MONOTONIC), never below 0. */
int64_t dlock__rms_left(int64_t deadline);
/* Re-raise the last error with another code and a prefix. */
int dlock__rrewrap(int code, const char *kind, const char *prefix);
/* ESTORE "unexpected reply from KIND to WHAT". */
int dlock__rbad_reply(const char *kind, const char *what);
/* An integer reply (or a numeric string) into *v. @return 0; -1 otherwise. */
int dlock__rreply_int(const redisReply *r, long long *v);

/* ---- scripts ---- */
enum {
	/* KEYS[1] is always the holder key H; scripts derive the others from it. */
	DLOCK__RS_ACQUIRE, /* ARGV owner ttl flags permits qttl "pid host" ticket [run_id: fence
			      guard; the script adds master_replid] -> {1, fence} | {1, fence,
			      reservation: WAIT, then confirm} | {0, retry_ms} */
	DLOCK__RS_RELEASE, /* ARGV owner -> 1 | 0 (and PUBLISH on the channel) */
	DLOCK__RS_RENEW,   /* KEYS H1..Hn; ARGV owner1 ttl1 ... -> {fence|0, ...} (also extend) */
	DLOCK__RS_CANCEL,  /* ARGV owner -> 1 */
	DLOCK__RS_STATUS,  /* -> {now, fence, {hgetall H}, live waiters} */
	DLOCK__RS_RAISE,   /* ARGV fence -> counter after max(counter, fence) (Redlock) */
	DLOCK__RS_COUNT
};
extern const char *const dlock__rscript_text[DLOCK__RS_COUNT];

/* The names a client needs for one lock: the holder key (the scripts derive
 * the others from it) and the channel. NUL-terminated. */
enum { DLOCK__RK_H, DLOCK__RK_C, DLOCK__RK_COUNT };
typedef struct dlock__rkeys {
	char k[DLOCK__RK_COUNT][DLOCK__REDIS_KEY_MAX];
	size_t len[DLOCK__RK_COUNT];
} dlock__rkeys;
void dlock__rkeys_make(dlock__rkeys *k, const char *prefix, const char *name);
/* The prefix as written in keys (see the key layout above) into out (cap
 * bytes, at least DLOCK__REDIS_PREFIX_MAX + 1); returns its length. */
size_t dlock__rprefix_enc(char *out, size_t cap, const char *prefix);

/*
 * Argument vectors for the scripts: fills argv/lens after the first two
 * slots (EVALSHA, sha), returns argc. `nums` is scratch for numbers.
 */
typedef struct dlock__rargs {
	const char *argv[12];
	size_t lens[12];
	char nums[4][24];
	char flags[4];
	char meta[300];
	int argc;
} dlock__rargs;
/* ticket: fair-queue position for a new waiter (0 = the server's clock). */
void dlock__rargs_acquire(dlock__rargs *a, const dlock__rkeys *k, const dlock_request *req, int64_t ticket);
/* After an acquire try: remember in the grant's slot whether it left us registered as a waiter. */
void dlock__racquire_done(const dlock_request *req, int rc, dlock_grant *out);
/* Append one more string argument (borrowed until the command is sent). */
void dlock__rargs_add(dlock__rargs *a, const char *s);
/* release and cancel: the holder key and the owner */
void dlock__rargs_owner(dlock__rargs *a, const dlock__rkeys *k, const dlock_request *req);
void dlock__rargs_status(dlock__rargs *a, const dlock__rkeys *k);

/* Decode an acquire reply (a grant's optional third element, the fence
 * guard's reservation, is the caller's to read). @return 0 (*fence) /
 * DLOCK_ELOCKED (*retry_ms) / ESTORE. */
int dlock__racquire_reply(const redisReply *r, uint64_t *fence, int64_t *retry_ms, const char *kind);

/* Append the status of `name` decoded from a STATUS reply to *out. */
int dlock__rstatus_decode(const redisReply *r, const char *name, dlock_lock_status **out, size_t *count,
			  const char *kind);

/* A renew batch: argv/lens with slots 0-1 left for EVALSHA/sha (script RENEW). */
typedef struct dlock__rbatch {
	int argc;
	const char **argv;
	size_t *lens;
	char *keys, *nums;
} dlock__rbatch;
int dlock__rbatch_renew(dlock__rbatch *b, const char *prefix, const dlock_request *const *reqs, size_t n);
void dlock__rbatch_free(dlock__rbatch *b);
/* results[i] = 0 (renewed) or DLOCK_ENOTHELD from a RENEW reply of n entries. */
int dlock__rrenew_reply(const redisReply *r, size_t n, int *results, const char *kind);

/*
 * After a grant on c: WAIT until n replicas have it; then, with reserve > 0,
 * confirm the fence guard's reservation on k (best effort). @return the
 * replicas that acknowledged (below n: too few in time; -1: no time left to
 * ask; -2: the WAIT got no answer). *drop: the connection broke or timed
 * out (the caller drops c; with an answer >= n the grant still stands).
 */
long long dlock__rwait_replicas(redisContext *c, const dlock__rserver *srv, const char *kind, int n, long long reserve,
				const dlock__rkeys *k, const char *server_id, int64_t deadline, bool *drop);
/* The run_id of the server on c (INFO server) into out: new for every
 * server process. The fence guard's scripts add the server's master_replid
 * (new on every promotion) themselves, atomically with the grant: run_id
 * alone stays the same across a failback (fence.lua). @return 0; the read's
 * error (the caller drops c); ESTORE when the answer has none. */
int dlock__rrun_id(redisContext *c, const dlock__rserver *srv, const char *kind, int64_t deadline, char *out,
		   size_t cap);

/* SCRIPT LOAD every text[DLOCK__RS_COUNT] on c in one pipelined round trip,
 * sha[i] getting each SHA1 (EVALSHA from then on; the same on every server).
 * @return 0; the first error reply's error; the read's error with *broken
 * (the caller drops c). */
int dlock__rload_scripts(redisContext *c, const dlock__rserver *srv, const char *kind, const char *const *text,
			 char (*sha)[41], int64_t deadline, bool *broken);

/* Options wait_replicas and fence_replicas (0-100) into *wait, *fence; unchanged when absent. */
int dlock__rreplicas_option(dlock_uri *uri, const char *kind, int *wait, int *fence);

/* Append to *names (of *n) the lock names with holders or waiters under prefix on one
 * server (SCAN; connects *c if NULL; duplicates and foreign keys possible: be->list).
 * Free each name and the array with free(). */
int dlock__rscan_names(redisContext **c, const dlock__rserver *srv, const char *prefix, const char *kind, char ***names,
		       size_t *n);

/* dlock__rscan_names with the whole scan bounded by `deadline`; a connection
 * it makes is non-blocking (dlock__rconnect_by). */
int dlock__rscan_names_by(redisContext **c, const dlock__rserver *srv, const char *prefix, const char *kind,
			  char ***names, size_t *n, int64_t deadline);

/* ---- notifier: pub/sub wake-ups for waiters (one per store handle) ---- */
typedef struct dlock__rnotify dlock__rnotify;

/* Make a notifier over n servers (borrowed; must outlive it; their addresses are
 * changed only through dlock__rnotify_moved) that wakes be's waiters through
 * the core's board. Nothing connects yet. */
int dlock__rnotify_new(dlock__rnotify **out, dlock_backend *be, dlock__rserver *srv, size_t n, const char *kind);
/* Server i moved (Sentinel failover): update its address and resubscribe there. Any thread. */
void dlock__rnotify_moved(dlock__rnotify *nt, size_t i, const char *host, int port);
void dlock__rnotify_free(dlock__rnotify *nt);
/* Redis Cluster: subscribe with SSUBSCRIBE, each channel on the one server
 * home(arg, channel) names (an index below n; -2: none known yet). home is
 * called under the notifier's lock, from threads that call watch or
 * dlock__rnotify_rehome: it may read what those threads write. */
void dlock__rnotify_sharded(dlock__rnotify *nt, int (*home)(void *arg, const char *channel), void *arg);
/* The slot map changed: ask home again for every channel and move the subscriptions. */
void dlock__rnotify_rehome(dlock__rnotify *nt);
/* be->watch: before each waiting try, make the releases published on the
 * channels of req's lock under `prefix` (the lock's, and our direct one)
 * reach the board. Never waits for the network. Any thread. */
int dlock__rnotify_watch(dlock__rnotify *nt, const dlock_request *req, const char *prefix);
/* be->unwatch: the wait is over (granted or given up): drop its subscription. Any thread. */
void dlock__rnotify_forget(dlock__rnotify *nt, const dlock_request *req);

#endif
