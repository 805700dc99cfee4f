/*
 * floor.c — each store's floor for `dlock bench` (src/tools/bench.h), built as
 * the module dlock-floor.so that the tool loads when a bench asks for it, so
 * that the tool itself links no store client library:
 * the round trips of one acquire+release, done with the store's own client
 * library on the same kind of connection, nothing else. The figure a lock
 * cannot beat without saving a round trip, so `dlock bench` prints ours as
 * a ratio of it.
 *
 *   redis     2 x PING (hiredis, one blocking connection); redis+cluster: to its first node
 *   etcd      Txn (create-if-absent with a lease + range of the oldest key)
 *             + DeleteRange (libcurl on the JSON gateway, one kept-alive
 *             connection)
 *   zk        create (ephemeral sequential) + delete (libzookeeper-mt, sync)
 *   postgres  2 x SELECT 1 (libpq)
 *   mysql     2 x DO 1 (libmariadb)
 *   memcached 2 x get of one key (libmemcached, one connection)
 *   sqlite    2 x BEGIN IMMEDIATE / write one row / COMMIT (WAL,
 *             synchronous=NORMAL, as the store opens its file; prepared
 *             statements) on a sibling file in the same directory. An
 *             empty BEGIN/COMMIT writes nothing to the WAL, while every
 *             acquire and release must commit a change: the floor is the
 *             smallest transaction a lock can be.
 *
 * The URI is parsed here only as far as the floor needs (host, port,
 * credentials, database); the store's own options are ignored.
 */
#include "bench.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DLOCK_WITH_REDIS
#include <hiredis/hiredis.h>
#endif
#ifdef DLOCK_WITH_ETCD
#include <curl/curl.h>
#endif
#ifdef DLOCK_WITH_ZOOKEEPER
#ifndef THREADED
#define THREADED /* libzookeeper-mt: the synchronous API */
#endif
#include <zookeeper/zookeeper.h>
#endif
#ifdef DLOCK_WITH_POSTGRES
#include <libpq-fe.h>
#endif
#ifdef DLOCK_WITH_MYSQL
#include <mysql.h>
#endif
#ifdef DLOCK_WITH_SQLITE
#include <sqlite3.h>
#endif
#ifdef DLOCK_WITH_MEMCACHED
#include <libmemcached/memcached.h>
#endif

enum kind { K_REDIS, K_ETCD, K_ZK, K_PG, K_MYSQL, K_SQLITE, K_MEMCACHED };

struct bench_floor {
	enum kind kind;
	const char *what;
#ifdef DLOCK_WITH_REDIS
	redisContext *redis;
#endif
#ifdef DLOCK_WITH_ETCD
	CURL *curl;
	struct curl_slist *headers;
	char url_txn[400], url_del[400];
	char txn[2048], del[256];
	size_t got;
#endif
#ifdef DLOCK_WITH_ZOOKEEPER
	zhandle_t *zk;
	char zpath[128];
#endif
#ifdef DLOCK_WITH_POSTGRES
	PGconn *pg;
#endif
#ifdef DLOCK_WITH_MYSQL
	MYSQL *my;
#endif
#ifdef DLOCK_WITH_SQLITE
	sqlite3 *db;
	sqlite3_stmt *st[4];
	char file[4096];
#endif
#ifdef DLOCK_WITH_MEMCACHED
	memcached_st *mc;
#endif
};

/* The parts of scheme://[user[:pass]@]host[:port][,more][/path][?query]. */
typedef struct parts {
	char scheme[16], user[256], pass[256], host[256], hosts[1024], path[2048];
	int port;
} parts;

static void pct_decode(char *dst, size_t len, const char *src, size_t n)
{
	size_t o = 0;
	for (size_t i = 0; i < n && o + 1 < len; i++) {
		if (src[i] == '%' && i + 2 < n && isxdigit((unsigned char)src[i + 1]) &&
		    isxdigit((unsigned char)src[i + 2])) {
			char hex[3] = { src[i + 1], src[i + 2], 0 };
			dst[o++] = (char)strtol(hex, NULL, 16);
			i += 2;
		} else {
			dst[o++] = src[i];
		}
	}
	dst[o] = '\0';
}

static int split(parts *p, const char *uri)
{
	memset(p, 0, sizeof(*p));
	const char *s = strstr(uri, "://");
	if (!s || (size_t)(s - uri) >= sizeof(p->scheme))
		return -1;
	memcpy(p->scheme, uri, (size_t)(s - uri));
	s += 3;
	size_t auth_end = strcspn(s, "/?#");
	/* The last '@' ends the user info, as for the core: a password may hold a raw '@'. */
	const char *at = NULL;
	for (const char *c = s; c < s + auth_end; c++)
		if (*c == '@')
			at = c;
	if (at) {
		const char *colon = memchr(s, ':', (size_t)(at - s));
		pct_decode(p->user, sizeof(p->user), s, (size_t)((colon ? colon : at) - s));
		if (colon)
			pct_decode(p->pass, sizeof(p->pass), colon + 1, (size_t)(at - colon - 1));
		auth_end -= (size_t)(at + 1 - s);
		s = at + 1;
	}
	snprintf(p->hosts, sizeof(p->hosts), "%.*s", (int)auth_end, s);
	size_t first = strcspn(p->hosts, ",");
	snprintf(p->host, sizeof(p->host), "%.*s", (int)first, p->hosts);
	char *colon = strrchr(p->host, ':');
	if (colon && !strchr(colon, ']')) {
		p->port = atoi(colon + 1);
		*colon = '\0';
	}
	const char *rest = s + auth_end;
	if (*rest == '/')
		snprintf(p->path, sizeof(p->path), "%.*s", (int)strcspn(rest, "?"), rest);
	return 0;
}

static int fail(char *err, size_t len, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t len, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return rc;
}

#ifdef DLOCK_WITH_ETCD
static void b64(char *o, const char *s)
{
	static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = strlen(s);
	for (size_t i = 0; i < n; i += 3) {
		unsigned v = (unsigned)(unsigned char)s[i] << 16;
		if (i + 1 < n)
			v |= (unsigned)(unsigned char)s[i + 1] << 8;
		if (i + 2 < n)
			v |= (unsigned char)s[i + 2];
		*o++ = t[v >> 18 & 63];
		*o++ = t[v >> 12 & 63];
		*o++ = i + 1 < n ? t[v >> 6 & 63] : '=';
		*o++ = i + 2 < n ? t[v & 63] : '=';
	}
	*o = '\0';
}

typedef struct body {
	char data[4096];
	size_t n;
} body;

static size_t sink(char *d, size_t size, size_t nmemb, void *ud)
{
	body *b = ud;
	size_t len = size * nmemb, room = sizeof(b->data) - 1 - b->n;
	size_t take = len < room ? len : room; /* keep the head; drain the rest */
	memcpy(b->data + b->n, d, take);
	b->n += take;
	b->data[b->n] = '\0';
	return len;
}

static int post(bench_floor *f, const char *url, const char *json, body *b, char *err, size_t len)
{
	b->n = 0;
	b->data[0] = '\0';
	curl_easy_setopt(f->curl, CURLOPT_URL, url);
	curl_easy_setopt(f->curl, CURLOPT_POSTFIELDS, json);
	curl_easy_setopt(f->curl, CURLOPT_WRITEDATA, b);
	CURLcode c = curl_easy_perform(f->curl);
	long status = 0;
	curl_easy_getinfo(f->curl, CURLINFO_RESPONSE_CODE, &status);
	if (c != CURLE_OK || status != 200)
		return fail(err, len, -1, "etcd %s: %s (HTTP %ld) %.200s", url, curl_easy_strerror(c), status, b->data);
	return 0;
}
#endif

#ifdef DLOCK_WITH_ZOOKEEPER
static void zk_watch(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	(void)zh, (void)type, (void)state, (void)path, (void)ctx;
}
#endif

static void floor_close(bench_floor *f);

static int floor_open(bench_floor **out, const char *uri, char *err, size_t errlen)
{
	*out = NULL;
	parts p;
	if (split(&p, uri) != 0)
		return fail(err, errlen, -1, "cannot parse the store URI");
	bench_floor *f = calloc(1, sizeof(*f));
	if (!f)
		return fail(err, errlen, -1, "out of memory");
	int rc = 1;
	if (strcmp(p.scheme, "redis") == 0 || strcmp(p.scheme, "redis+cluster") == 0) {
#ifdef DLOCK_WITH_REDIS
		f->kind = K_REDIS;
		/* a cluster: the first node named (every node is one hop away) */
		f->what = p.scheme[5] ? "2 x PING (hiredis, to one node)" : "2 x PING (hiredis)";
		struct timeval tv = { 5, 0 };
		f->redis = redisConnectWithTimeout(p.host, p.port ? p.port : 6379, tv);
		if (!f->redis || f->redis->err) {
			rc = fail(err, errlen, -1, "redis %s:%d: %s", p.host, p.port,
				  f->redis ? f->redis->errstr : "out of memory");
			goto bad;
		}
		if (p.pass[0]) {
			redisReply *r = p.user[0] ? redisCommand(f->redis, "AUTH %s %s", p.user, p.pass)
						  : redisCommand(f->redis, "AUTH %s", p.pass);
			int ok = r && r->type != REDIS_REPLY_ERROR;
			if (r)
				freeReplyObject(r);
			if (!ok) {
				rc = fail(err, errlen, -1, "redis: AUTH refused");
				goto bad;
			}
		}
		*out = f;
		return 0;
#else
		rc = fail(err, errlen, 1, "built without hiredis");
#endif
	} else if (strcmp(p.scheme, "etcd") == 0) {
#ifdef DLOCK_WITH_ETCD
		f->kind = K_ETCD;
		f->what = "Txn + DeleteRange (libcurl, JSON gateway)";
		f->curl = curl_easy_init();
		f->headers = curl_slist_append(NULL, "Content-Type: application/json");
		if (!f->curl || !f->headers) {
			rc = fail(err, errlen, -1, "out of memory");
			goto bad;
		}
		curl_easy_setopt(f->curl, CURLOPT_HTTPHEADER, f->headers);
		curl_easy_setopt(f->curl, CURLOPT_TCP_NODELAY, 1L);
		curl_easy_setopt(f->curl, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(f->curl, CURLOPT_TIMEOUT_MS, 10000L);
		curl_easy_setopt(f->curl, CURLOPT_WRITEFUNCTION, sink);
		char base[300], url[320];
		snprintf(base, sizeof(base), "http://%s:%d", p.host, p.port ? p.port : 2379);
		snprintf(url, sizeof(url), "%s/v3/lease/grant", base);
		body b;
		if (post(f, url, "{\"TTL\":\"60\"}", &b, err, errlen) != 0) {
			rc = -1;
			goto bad;
		}
		/* The same shape as the store's acquire: create-if-absent with a
		 * lease, and read the oldest contender in the same Txn. */
		char *id = strstr(b.data, "\"ID\":\"");
		if (!id) {
			rc = fail(err, errlen, -1, "etcd: lease grant: %.200s", b.data);
			goto bad;
		}
		id += 6;
		char key[128], dir[128], end[128], k64[200], d64[200], e64[200];
		snprintf(dir, sizeof(dir), "dlock-bench-floor/%d/", (int)getpid());
		snprintf(end, sizeof(end), "dlock-bench-floor/%d0", (int)getpid());
		snprintf(key, sizeof(key), "dlock-bench-floor/%d/k", (int)getpid());
		b64(k64, key);
		b64(d64, dir);
		b64(e64, end);
		snprintf(f->txn, sizeof(f->txn),
			 "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"create_revision\":\"0\","
			 "\"result\":\"EQUAL\"}],\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"eA==\","
			 "\"lease\":\"%.*s\"}},{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
			 "\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\"}}],\"failure\":[]}",
			 k64, k64, (int)strcspn(id, "\""), id, d64, e64);
		snprintf(f->del, sizeof(f->del), "{\"key\":\"%s\"}", k64);
		snprintf(f->url_txn, sizeof(f->url_txn), "%s/v3/kv/txn", base);
		snprintf(f->url_del, sizeof(f->url_del), "%s/v3/kv/deleterange", base);
		*out = f;
		return 0;
#else
		rc = fail(err, errlen, 1, "built without libcurl");
#endif
	} else if (strcmp(p.scheme, "zk") == 0) {
#ifdef DLOCK_WITH_ZOOKEEPER
		f->kind = K_ZK;
		f->what = "create + delete (libzookeeper-mt)";
		zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
		f->zk = zookeeper_init(p.hosts, zk_watch, 30000, NULL, NULL, 0);
		if (!f->zk) {
			rc = fail(err, errlen, -1, "zookeeper_init %s: %s", p.hosts, strerror(errno));
			goto bad;
		}
		/* The sync API waits for the session itself; creating the parent
		 * both connects and prepares the floor's directory. */
		int z = ZCONNECTIONLOSS;
		for (int i = 0; i < 100 && (z == ZCONNECTIONLOSS || z == ZINVALIDSTATE); i++) {
			z = zoo_create(f->zk, "/dlock-bench-floor", "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0);
			if (z == ZCONNECTIONLOSS || z == ZINVALIDSTATE)
				usleep(50000);
		}
		if (z != ZOK && z != ZNODEEXISTS) {
			rc = fail(err, errlen, -1, "zookeeper %s: %s", p.hosts, zerror(z));
			goto bad;
		}
		*out = f;
		return 0;
#else
		rc = fail(err, errlen, 1, "built without libzookeeper-mt");
#endif
	} else if (strcmp(p.scheme, "postgres") == 0 || strcmp(p.scheme, "postgresql") == 0) {
#ifdef DLOCK_WITH_POSTGRES
		f->kind = K_PG;
		f->what = "2 x SELECT 1 (libpq)";
		const char *keys[] = { "host", "port", "user", "password", "dbname", NULL };
		char port[16];
		snprintf(port, sizeof(port), "%d", p.port ? p.port : 5432);
		const char *vals[] = { p.host,
				       port,
				       p.user[0] ? p.user : NULL,
				       p.pass[0] ? p.pass : NULL,
				       p.path[0] ? p.path + 1 : NULL,
				       NULL };
		f->pg = PQconnectdbParams(keys, vals, 0);
		if (!f->pg || PQstatus(f->pg) != CONNECTION_OK) {
			rc = fail(err, errlen, -1, "postgres: %s", f->pg ? PQerrorMessage(f->pg) : "out of memory");
			goto bad;
		}
		*out = f;
		return 0;
#else
		rc = fail(err, errlen, 1, "built without libpq");
#endif
	} else if (strcmp(p.scheme, "mysql") == 0 || strcmp(p.scheme, "mariadb") == 0) {
#ifdef DLOCK_WITH_MYSQL
		f->kind = K_MYSQL;
		f->what = "2 x DO 1 (libmariadb)";
		f->my = mysql_init(NULL);
		if (!f->my || !mysql_real_connect(f->my, p.host, p.user, p.pass, p.path[0] ? p.path + 1 : NULL,
						  (unsigned)(p.port ? p.port : 3306), NULL, 0)) {
			rc = fail(err, errlen, -1, "mysql: %s", f->my ? mysql_error(f->my) : "out of memory");
			goto bad;
		}
		*out = f;
		return 0;
#else
		rc = fail(err, errlen, 1, "built without libmariadb");
#endif
	} else if (strcmp(p.scheme, "sqlite") == 0) {
#ifdef DLOCK_WITH_SQLITE
		f->kind = K_SQLITE;
		f->what = "2 x BEGIN IMMEDIATE/one-row write/COMMIT (sqlite3, WAL)";
		const char *path = uri + strlen("sqlite://");
		/* A sibling file: same directory, same file system, same locking. */
		snprintf(f->file, sizeof(f->file), "%.*s.floor-%d", (int)strcspn(path, "?"), path, (int)getpid());
		if (sqlite3_open(f->file, &f->db) != SQLITE_OK) {
			rc = fail(err, errlen, -1, "sqlite %s: %s", f->file,
				  f->db ? sqlite3_errmsg(f->db) : "out of memory");
			goto bad;
		}
		sqlite3_busy_timeout(f->db, 10000);
		static const char *const sql[4] = { "BEGIN IMMEDIATE", "COMMIT",
						    "INSERT OR REPLACE INTO f VALUES (1, 'owner')",
						    "DELETE FROM f WHERE k = 1" };
		int ok = sqlite3_exec(f->db,
				      "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
				      "CREATE TABLE IF NOT EXISTS f (k INTEGER PRIMARY KEY, v TEXT);",
				      NULL, NULL, NULL) == SQLITE_OK;
		for (int i = 0; ok && i < 4; i++)
			ok = sqlite3_prepare_v2(f->db, sql[i], -1, &f->st[i], NULL) == SQLITE_OK;
		if (!ok) {
			rc = fail(err, errlen, -1, "sqlite %s: %s", f->file, sqlite3_errmsg(f->db));
			goto bad;
		}
		*out = f;
		return 0;
#else
		rc = fail(err, errlen, 1, "built without sqlite3");
#endif
	} else if (strcmp(p.scheme, "memcached") == 0) {
#ifdef DLOCK_WITH_MEMCACHED
		f->kind = K_MEMCACHED;
		f->what = "2 x get (libmemcached)";
		f->mc = memcached_create(NULL);
		memcached_return_t m = f->mc ? memcached_server_add(f->mc, p.host, (in_port_t)(p.port ? p.port : 11211))
					     : MEMCACHED_MEMORY_ALLOCATION_FAILURE;
		if (m == MEMCACHED_SUCCESS)
			memcached_behavior_set(f->mc, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
		if (m != MEMCACHED_SUCCESS) {
			rc = fail(err, errlen, -1, "memcached %s:%d: %s", p.host, p.port,
				  f->mc ? memcached_strerror(f->mc, m) : "out of memory");
			goto bad;
		}
		*out = f;
		return 0;
#else
		rc = fail(err, errlen, 1, "built without libmemcached");
#endif
	} else {
		rc = fail(err, errlen, 1, "no floor for %s:// stores", p.scheme);
	}
#if defined(DLOCK_WITH_REDIS) || defined(DLOCK_WITH_ETCD) || defined(DLOCK_WITH_ZOOKEEPER) ||      \
	defined(DLOCK_WITH_POSTGRES) || defined(DLOCK_WITH_MYSQL) || defined(DLOCK_WITH_SQLITE) || \
	defined(DLOCK_WITH_MEMCACHED)
bad:
#endif
	floor_close(f);
	return rc;
}

static const char *floor_what(const bench_floor *f)
{
	return f ? f->what : "none";
}

static int floor_step(bench_floor *f, char *err, size_t errlen)
{
	switch (f->kind) {
#ifdef DLOCK_WITH_REDIS
	case K_REDIS:
		for (int i = 0; i < 2; i++) {
			redisReply *r = redisCommand(f->redis, "PING");
			if (!r)
				return fail(err, errlen, -1, "redis PING: %s", f->redis->errstr);
			freeReplyObject(r);
		}
		return 0;
#endif
#ifdef DLOCK_WITH_ETCD
	case K_ETCD: {
		body b;
		if (post(f, f->url_txn, f->txn, &b, err, errlen) != 0)
			return -1;
		if (!strstr(b.data, "\"succeeded\":true"))
			return fail(err, errlen, -1, "etcd floor Txn did not create its key: %.200s", b.data);
		return post(f, f->url_del, f->del, &b, err, errlen);
	}
#endif
#ifdef DLOCK_WITH_ZOOKEEPER
	case K_ZK: {
		int z = zoo_create(f->zk, "/dlock-bench-floor/n-", "", 0, &ZOO_OPEN_ACL_UNSAFE,
				   ZOO_EPHEMERAL | ZOO_SEQUENCE, f->zpath, (int)sizeof(f->zpath));
		if (z == ZOK)
			z = zoo_delete(f->zk, f->zpath, -1);
		return z == ZOK ? 0 : fail(err, errlen, -1, "zookeeper: %s", zerror(z));
	}
#endif
#ifdef DLOCK_WITH_POSTGRES
	case K_PG:
		for (int i = 0; i < 2; i++) {
			PGresult *r = PQexec(f->pg, "SELECT 1");
			int ok = PQresultStatus(r) == PGRES_TUPLES_OK;
			PQclear(r);
			if (!ok)
				return fail(err, errlen, -1, "postgres: %s", PQerrorMessage(f->pg));
		}
		return 0;
#endif
#ifdef DLOCK_WITH_MYSQL
	case K_MYSQL:
		for (int i = 0; i < 2; i++)
			if (mysql_query(f->my, "DO 1") != 0)
				return fail(err, errlen, -1, "mysql: %s", mysql_error(f->my));
		return 0;
#endif
#ifdef DLOCK_WITH_MEMCACHED
	case K_MEMCACHED:
		for (int i = 0; i < 2; i++) {
			size_t len = 0;
			uint32_t fl = 0;
			memcached_return_t m;
			char *v = memcached_get(f->mc, "dlock-bench-floor", 17, &len, &fl, &m);
			free(v);
			if (m != MEMCACHED_SUCCESS && m != MEMCACHED_NOTFOUND)
				return fail(err, errlen, -1, "memcached get: %s", memcached_strerror(f->mc, m));
		}
		return 0;
#endif
#ifdef DLOCK_WITH_SQLITE
	case K_SQLITE:
		/* acquire: BEGIN, write, COMMIT; release: BEGIN, delete, COMMIT */
		for (int i = 0; i < 2; i++) {
			int seq[3] = { 0, 2 + i, 1 };
			for (int k = 0; k < 3; k++) {
				sqlite3_stmt *q = f->st[seq[k]];
				int r = sqlite3_step(q);
				sqlite3_reset(q);
				if (r != SQLITE_DONE)
					return fail(err, errlen, -1, "sqlite: %s", sqlite3_errmsg(f->db));
			}
		}
		return 0;
#endif
	default:
		return fail(err, errlen, -1, "no floor");
	}
}

#ifdef DLOCK_WITH_REDIS
/* The sum of the counters named by keys ("name:") in one INFO section; -1
 * when the server did not answer. A counter not listed yet counts 0. */
static long long redis_info_sum(bench_floor *f, const char *section, const char *const *keys, int nkeys)
{
	redisReply *r = redisCommand(f->redis, "INFO %s", section);
	long long n = -1;
	if (r && r->type == REDIS_REPLY_STRING) {
		n = 0;
		for (int i = 0; i < nkeys; i++) {
			const char *s = strstr(r->str, keys[i]);
			if (s)
				n += strtoll(s + strlen(keys[i]), NULL, 10);
		}
	}
	if (r)
		freeReplyObject(r);
	return n;
}
#endif

static long long floor_server_ops(bench_floor *f)
{
#ifdef DLOCK_WITH_REDIS
	/* Socket reads, not commands: a pipelined batch is one read (or a few
	 * for a large one), and redis.call() inside a script counts as a
	 * command. Reads are the closest thing to round trips. */
	static const char *const keys[1] = { "total_reads_processed:" };
	if (f && f->kind == K_REDIS)
		return redis_info_sum(f, "stats", keys, 1);
#endif
	(void)f;
	return -1;
}

static long long floor_server_scripts(bench_floor *f)
{
#ifdef DLOCK_WITH_REDIS
	static const char *const keys[2] = { "cmdstat_evalsha:calls=", "cmdstat_eval:calls=" };
	if (f && f->kind == K_REDIS)
		return redis_info_sum(f, "commandstats", keys, 2);
#endif
	(void)f;
	return -1;
}

static long long floor_server_commands(bench_floor *f)
{
#ifdef DLOCK_WITH_REDIS
	/* What a client of the Redis stores or of the floor sends itself; the
	 * commands scripts call inside are counted by Redis too, so the sum of
	 * every entry would count each script's body. INFO counts: a reading
	 * adds one to the next (bench.c subtracts it). */
	static const char *const keys[] = {
		"cmdstat_evalsha:calls=",     "cmdstat_eval:calls=",           "cmdstat_evalsha_ro:calls=",
		"cmdstat_eval_ro:calls=",     "cmdstat_subscribe:calls=",      "cmdstat_unsubscribe:calls=",
		"cmdstat_ssubscribe:calls=",  "cmdstat_sunsubscribe:calls=",   "cmdstat_ping:calls=",
		"cmdstat_script|load:calls=", "cmdstat_hello:calls=",          "cmdstat_auth:calls=",
		"cmdstat_select:calls=",      "cmdstat_client|setname:calls=", "cmdstat_client|id:calls=",
		"cmdstat_role:calls=",        "cmdstat_wait:calls=",           "cmdstat_info:calls=",
	};
	if (f && f->kind == K_REDIS)
		return redis_info_sum(f, "commandstats", keys, (int)(sizeof keys / sizeof keys[0]));
#endif
	(void)f;
	return -1;
}

static void floor_close(bench_floor *f)
{
	if (!f)
		return;
#ifdef DLOCK_WITH_MEMCACHED
	if (f->mc)
		memcached_free(f->mc);
#endif
#ifdef DLOCK_WITH_REDIS
	if (f->redis)
		redisFree(f->redis);
#endif
#ifdef DLOCK_WITH_ETCD
	if (f->curl)
		curl_easy_cleanup(f->curl);
	curl_slist_free_all(f->headers);
#endif
#ifdef DLOCK_WITH_ZOOKEEPER
	if (f->zk)
		zookeeper_close(f->zk);
#endif
#ifdef DLOCK_WITH_POSTGRES
	if (f->pg)
		PQfinish(f->pg);
#endif
#ifdef DLOCK_WITH_MYSQL
	if (f->my)
		mysql_close(f->my);
#endif
#ifdef DLOCK_WITH_SQLITE
	if (f->db) {
		for (int i = 0; i < 4; i++)
			sqlite3_finalize(f->st[i]);
		sqlite3_close(f->db);
		char side[4200];
		unlink(f->file);
		snprintf(side, sizeof(side), "%s-wal", f->file);
		unlink(side);
		snprintf(side, sizeof(side), "%s-shm", f->file);
		unlink(side);
	}
#endif
	free(f);
}

/* What the tool looks up (BENCH_FLOOR_SYMBOL): the whole module. */
const bench_floor_module dlock_bench_floor_module = {
	.version = BENCH_FLOOR_VERSION,
	.open = floor_open,
	.what = floor_what,
	.step = floor_step,
	.server_ops = floor_server_ops,
	.server_scripts = floor_server_scripts,
	.server_commands = floor_server_commands,
	.close = floor_close,
};
