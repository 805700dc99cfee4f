/*
 * redis.secret (issue 30, "also"): passwords holding '/', '?', '#', '@' and
 * '=' (base64 secrets hold '/' and '=') in redis://, redlock:// and
 * redis+cluster:// URIs. Written raw, half or fully percent-escaped, they log
 * in (an ACL user of this test on every server); a wrong one is refused with
 * DLOCK_EAUTH and a message that holds no piece of it (3 characters or more),
 * nor does the store's redacted URI. Before, the part after the '/' was read
 * as the path and shown: "bad database number 'r1tXY@127.0.0.1:…'".
 * Usage: redis_secret REDIS_URI_FILE REDLOCK_URI_FILE CLUSTER_URI_FILE
 */
#include "stores/redis_common_test.h"

#define USER "dlocksecret"
#define PASS "Sek/r1tX?Y#q@z=9"
#define WRONG "Qz/x7?Wv#k@j=8"

/* Does text contain a piece (>= 3 characters) of secret? */
static int shows_piece(const char *text, const char *secret)
{
	size_t n = strlen(secret);
	for (size_t i = 0; i + 3 <= n; i++) {
		char piece[4] = { secret[i], secret[i + 1], secret[i + 2], 0 };
		if (strstr(text, piece))
			return 1;
	}
	return 0;
}

/* Open scheme://userinfo@hosts+tail: want 0 (and one lock round trip) or an error. */
static void try_open(const char *scheme, const char *userinfo, const char *hosts, const char *tail, int want,
		     const char *secret)
{
	char u[4096];
	snprintf(u, sizeof(u), "%s://%s@%s%s", scheme, userinfo, hosts, tail);
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, u);
	if (rc != want)
		fprintf(stderr, "%s://%s@%s%s: %s, wanted %s (%s)\n", scheme, userinfo, hosts, tail,
			dlock_error_name(rc), dlock_error_name(want), dlock_error_last()->message);
	CHECK_RC(rc, want);
	if (rc == 0) {
		CHECK(!shows_piece(dlock_store_uri(s), secret));
		printf("  %-13s %-36s -> ok, shown as %s\n", scheme, userinfo, dlock_store_uri(s));
		dlock_lock *l = NULL;
		CHECK_RC(dlock_lock_new(&l, s, "secret-test", NULL), 0);
		CHECK_RC(dlock_acquire(l, 5000), 0);
		CHECK_RC(dlock_release(l), 0);
		dlock_lock_free(l);
		dlock_store_close(s);
	} else {
		CHECK(!shows_piece(dlock_error_last()->message, secret));
		printf("  %-13s %-36s -> %s: %s\n", scheme, userinfo, dlock_error_name(rc),
		       dlock_error_last()->message);
	}
}

/* The scheme://HOSTS of the URI in file into hosts (without options). */
static void hosts_of(const char *file, char *hosts, size_t n)
{
	char uri[4096];
	FILE *f = fopen(file, "r");
	if (!f || !fgets(uri, sizeof(uri), f)) {
		fprintf(stderr, "no server: %s unreadable\n", file);
		exit(1);
	}
	fclose(f);
	uri[strcspn(uri, "\r\n")] = 0;
	const char *h = strstr(uri, "://");
	if (!h)
		exit(1);
	h += 3;
	snprintf(hosts, n, "%.*s", (int)strcspn(h, "/?"), h);
}

/* ACL SETUSER (or DELUSER) on every host of a host list. */
static void acl_all(const char *hosts, int add)
{
	char copy[4096];
	snprintf(copy, sizeof(copy), "%s", hosts);
	for (char *save = NULL, *h = strtok_r(copy, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
		char u[300];
		snprintf(u, sizeof(u), "redis://%s", h);
		redisContext *c = rt_raw(u);
		redisReply *r = add ? redisCommand(c, "ACL SETUSER %s on >%s ~* &* +@all", USER, PASS)
				    : redisCommand(c, "ACL DELUSER %s", USER);
		CHECK(r && r->type != REDIS_REPLY_ERROR);
		if (r)
			freeReplyObject(r);
		redisFree(c);
	}
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 64;
	setvbuf(stdout, NULL, _IOLBF, 0);
	static const char *scheme[3] = { "redis", "redlock", "redis+cluster" };
	char hosts[3][4096];
	for (int i = 0; i < 3; i++) {
		hosts_of(argv[1 + i], hosts[i], sizeof(hosts[i]));
		acl_all(hosts[i], 1);
	}
	for (int i = 0; i < 3; i++) {
		const char *h = hosts[i], *sc = scheme[i];
		const char *opts = i == 0 ? "/0?timeout=2s" : "?timeout=2s";
		try_open(sc, USER ":" PASS, h, "", 0, PASS);                        /* raw / ? # @ = */
		try_open(sc, USER ":" PASS, h, opts, 0, PASS);                      /* then a path, options */
		try_open(sc, USER ":Sek%2Fr1tX%3FY%23q%40z%3D9", h, opts, 0, PASS); /* every one escaped */
		try_open(sc, USER ":Sek/r1tX?Y#q%40z=9", h, "", 0, PASS);          /* '@' escaped only */
		try_open(sc, USER ":" WRONG, h, opts, DLOCK_EAUTH, WRONG);
		try_open(sc, USER ":Qz%2Fx7%3FWv%23k%40j%3D8", h, "", DLOCK_EAUTH, WRONG);
		/* the shape: the default user (no password on these servers) */
		try_open(sc, ":Sek/r1tXY", h, "", DLOCK_EAUTH, "Sek/r1tXY");
	}
	for (int i = 0; i < 3; i++)
		acl_all(hosts[i], 0);
	return tu_done("redis_secret");
}
