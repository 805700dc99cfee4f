/*
 * Redis over TLS (rediss://, tls=yes), against the redis-servers of
 * tests/servers/redis-tls.sh and the CA it made: a trusted certificate
 * works (locks, waits woken through the TLS pub/sub connection, Redlock over
 * three TLS masters); a certificate from another CA, with another name, or
 * expired is refused with a message that says so; a server that requires a
 * client certificate refuses us without one and serves us with it; plain
 * TCP to a TLS port fails within its bound; options that make no sense
 * without TLS, or that would turn the check off without saying so, are
 * refused. With a Sentinel set-up over TLS (redis-sentinel.sh with
 * REDIS_TLS=1): locks through the sentinels, then the master killed, and the
 * promoted replica found and served over TLS, with fences still rising.
 * Usage: redis_tls [SENTINEL_SCRIPT SENTINEL_DIR] (DLOCK_TEST_URI_FILE names DIR/uri of redis-tls.sh)
 */
#include "testutil/testutil.h"

#include <pthread.h>
#include <string.h>

static char uri[4096], dir[1024];

/* DIR/<file>'s first line, with `extra` ("&a=b") appended. */
static void uri_of(char *out, size_t n, const char *file, const char *extra)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	if (tu_first_line(path, out, n) != 0) {
		fprintf(stderr, "redis_tls: cannot read %s\n", path);
		exit(2);
	}
	size_t len = strlen(out);
	snprintf(out + len, n - len, "%s", extra);
}

/* The URI of `file` with its cacert= replaced by `cacert` (a file name in DIR/tls, or "" for none). */
static void with_ca(char *out, size_t n, const char *file, const char *cacert, const char *extra)
{
	char base[4096];
	uri_of(base, sizeof base, file, "");
	char *q = strstr(base, "cacert=");
	if (!q)
		exit(2);
	*q = '\0';
	if (*cacert)
		snprintf(out, n, "%scacert=%s/tls/%s%s", base, dir, cacert, extra);
	else
		snprintf(out, n, "%sconnect_timeout=2s%s", base, extra);
}

/* Opening `u` fails with `want`, and the message holds `says`. */
static void refused(const char *u, int want, const char *says)
{
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, u);
	const char *msg = dlock_error_last()->message;
	printf("  %s -> %s: %s\n", u + strcspn(u, "?"), dlock_error_name(rc), rc ? msg : "(opened)");
	CHECK_RC(rc, want);
	if (rc == want && says)
		CHECK(strstr(msg, says) != NULL);
	if (rc == 0)
		dlock_store_close(s);
}

/* Two handles on u: exclusion, a wait woken by the release, rising fences. */
static void locks_work(const char *u)
{
	dlock_store *s1 = NULL, *s2 = NULL;
	CHECK_RC(dlock_store_open(&s1, u), 0);
	CHECK_RC(dlock_store_open(&s2, u), 0);
	if (!s1 || !s2)
		goto out;
	dlock_lock *a = NULL, *b = NULL;
	CHECK_RC(dlock_lock_new(&a, s1, "tls-job", NULL), 0);
	CHECK_RC(dlock_lock_new(&b, s2, "tls-job", NULL), 0);
	CHECK_RC(dlock_acquire(a, 0), 0);
	uint64_t fa = dlock_fence(a);
	CHECK_RC(dlock_acquire(b, 0), DLOCK_ELOCKED);
	/* b waits; a's release wakes it through b's subscription (over TLS) */
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_acquire(b, 5000), 0);
	long long took = tu_now_ms() - t0;
	printf("  released and taken by the other handle in %lld ms; fences %llu, %llu\n", took, (unsigned long long)fa,
	       (unsigned long long)dlock_fence(b));
	CHECK(dlock_fence(b) > fa);
	CHECK_RC(dlock_release(b), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
out:
	dlock_store_close(s1);
	dlock_store_close(s2);
}

typedef struct waiter {
	dlock_store *s;
	int rc;
	long long at;
} waiter;

static void *wait_main(void *arg)
{
	waiter *w = arg;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, w->s, "tls-wake", NULL) != 0) {
		w->rc = -100;
		return NULL;
	}
	w->rc = dlock_acquire(l, 10000);
	w->at = tu_now_ms();
	if (w->rc == 0)
		dlock_release(l);
	dlock_lock_free(l);
	return NULL;
}

/* A waiter blocked in another thread is woken by the release (pub/sub over
 * TLS), well before its 1 s queue refresh would have tried again. */
static void wake_over_tls(const char *u)
{
	dlock_store *s1 = NULL, *s2 = NULL;
	CHECK_RC(dlock_store_open(&s1, u), 0);
	CHECK_RC(dlock_store_open(&s2, u), 0);
	if (!s1 || !s2)
		goto out;
	dlock_lock *a = NULL;
	CHECK_RC(dlock_lock_new(&a, s1, "tls-wake", NULL), 0);
	CHECK_RC(dlock_acquire(a, 0), 0);
	waiter w = { s2, 1, 0 };
	pthread_t t;
	pthread_create(&t, NULL, wait_main, &w);
	/* the waiter shows in status once it has tried */
	CHECK(tu_await_waiters(s1, "tls-wake", 1, 5000));
	long long released = tu_now_ms();
	CHECK_RC(dlock_release(a), 0);
	pthread_join(t, NULL);
	CHECK_RC(w.rc, 0);
	printf("  a waiting thread got the lock %lld ms after the release\n", w.at - released);
	CHECK(w.at - released < 500);
	dlock_lock_free(a);
out:
	dlock_store_close(s1);
	dlock_store_close(s2);
}

/* redis+sentinel:// over TLS: locks, then a failover, and locks again. */
static void sentinel_failover(const char *script, const char *sdir)
{
	char su[4096], path[4200], cmd[9000];
	snprintf(path, sizeof path, "%s/uri", sdir);
	if (tu_first_line(path, su, sizeof su) != 0) {
		CHECK(!"no sentinel URI");
		return;
	}
	locks_work(su);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, su), 0);
	if (!s)
		return;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, "tls-failover", NULL), 0);
	CHECK_RC(dlock_acquire(l, 5000), 0);
	uint64_t before = dlock_fence(l);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	snprintf(cmd, sizeof cmd, "bash '%s' kill-master '%s'", script, sdir);
	CHECK(system(cmd) == 0);
	/* the sentinel promotes the replica (down after 3 s); a new store finds it.
	 * The promoted master has no replica left: grants and fences are taken
	 * without waiting for one (wait_replicas=0, fence_replicas=0). */
	long long t0 = tu_now_ms(), until = t0 + 60000;
	int rc = -1;
	uint64_t after = 0;
	while (rc != 0 && tu_now_ms() < until) {
		s = NULL;
		char u[4200];
		snprintf(u, sizeof u, "%s&connect_timeout=2s&wait_replicas=0&fence_replicas=0", su);
		if (dlock_store_open(&s, u) == 0) {
			l = NULL;
			if (dlock_lock_new(&l, s, "tls-failover", NULL) == 0 && (rc = dlock_acquire(l, 1000)) == 0) {
				after = dlock_fence(l);
				dlock_release(l);
			}
			dlock_lock_free(l);
			dlock_store_close(s);
		}
	}
	printf("  master killed: the promoted replica served over TLS after %lld ms; fences %llu then %llu\n",
	       tu_now_ms() - t0, (unsigned long long)before, (unsigned long long)after);
	CHECK_RC(rc, 0);
	CHECK(after > before);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	tu_uri_from_env(uri, sizeof uri, "redis_tls");
	tu_server_dir(dir, sizeof dir);
	char u[16384], extra[4096];

	printf("a certificate from our CA:\n");
	locks_work(uri);
	wake_over_tls(uri);

	printf("refused, and saying why:\n");
	with_ca(u, sizeof u, "uri", "other-ca.pem", "");
	refused(u, DLOCK_EUNAVAILABLE, "not trusted");
	with_ca(u, sizeof u, "uri", "", ""); /* the system's CAs only */
	refused(u, DLOCK_EUNAVAILABLE, "not trusted");
	uri_of(u, sizeof u, "uri", "&sni=db.example.com");
	refused(u, DLOCK_EUNAVAILABLE, "hostname mismatch");
	uri_of(u, sizeof u, "uri_expired", "");
	refused(u, DLOCK_EUNAVAILABLE, "expired");
	uri_of(u, sizeof u, "uri_mtls", "&connect_timeout=2s");
	refused(u, DLOCK_EUNAVAILABLE, NULL); /* the server wants our certificate */
	/* plain TCP to the TLS port: the server drops it */
	char plain[4096];
	uri_of(plain, sizeof plain, "uri", "");
	memmove(plain + 5, plain + 6, strlen(plain + 6) + 1); /* rediss:// -> redis:// */
	*strstr(plain, "?") = '\0';
	snprintf(u, sizeof u, "%s?connect_timeout=1s", plain);
	long long t0 = tu_now_ms();
	refused(u, DLOCK_EUNAVAILABLE, NULL);
	CHECK(tu_now_ms() - t0 < 3000);

	printf("bad options:\n");
	uri_of(u, sizeof u, "uri", "&insecure=yes");
	refused(u, DLOCK_EINVAL, "insecure=yes-i-know");
	snprintf(u, sizeof u, "%s?cacert=%s/tls/ca.pem", plain, dir);
	refused(u, DLOCK_EINVAL, "need TLS");
	snprintf(extra, sizeof extra, "&cert=%s/tls/client.pem", dir);
	uri_of(u, sizeof u, "uri", extra);
	refused(u, DLOCK_EINVAL, "go together");
	with_ca(u, sizeof u, "uri", "no-such-ca.pem", "");
	refused(u, DLOCK_EINVAL, "cacert");
	uri_of(u, sizeof u, "uri", "&tls=no");
	refused(u, DLOCK_EINVAL, NULL);

	printf("what the user asked for:\n");
	with_ca(u, sizeof u, "uri", "other-ca.pem", "&insecure=yes-i-know");
	locks_work(u);
	snprintf(extra, sizeof extra, "&cert=%s/tls/client.pem&key=%s/tls/client.key", dir, dir);
	uri_of(u, sizeof u, "uri_mtls", extra);
	locks_work(u);
	snprintf(u, sizeof u, "%s?tls=yes&cacert=%s/tls/ca.pem", plain, dir);
	locks_work(u);

	printf("redlock over three TLS masters:\n");
	uri_of(u, sizeof u, "uri_redlock", "");
	locks_work(u);

	if (argc == 3) {
		printf("redis+sentinel:// over TLS:\n");
		sentinel_failover(argv[1], argv[2]);
	}
	return tu_done("redis_tls");
}
