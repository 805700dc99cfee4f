/*
 * The ZooKeeper store's time bounds and orphan sweep, on a standalone server
 * of its own, through the fault proxy (tests/testutil/faultproxy.h) in
 * "blackhole" mode: connections stay open and nothing is forwarded (a hung
 * server or a dead link, not a reset the client would notice):
 *  - open, acquire (before and during a wait), release, extend and status
 *    return within their bounds while the link is black-holed;
 *  - a held lock whose link goes dark is reported lost by its deadline and
 *    before another client is granted;
 *  - a release or a cancel whose delete is lost leaves no node behind once
 *    the link is back, with the process idle (no further dlock call): the
 *    session watcher sweeps it, and another client gets the lock within one
 *    session timeout;
 *  - a create applied but unanswered ("drop") is undone once replies flow
 *    again, with the process idle, by the sweeper's probe.
 * Usage: zookeeper_time SERVER_SCRIPT SERVER_DIR [CASE...]  (URI from DLOCK_TEST_URI_FILE)
 */
#include "testutil/faultproxy.h"
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <zookeeper/zookeeper.h>

static char direct_uri[1024];
static char server_hp[256];
static char run_id[16];
static zhandle_t *raw;

/* ---------------------------------------------------------------- the fault proxy */

static tu_proxy *px;
static char *px_uri; /* the server's URI through the proxy */

static void px_set_dark(int on)
{
	if (tu_proxy_set(px, -1, on ? "blackhole" : "pass") != 0)
		exit(2);
}

/* Cut every connection (the client notices at once and reconnects). */
static void px_reset(void)
{
	if (tu_proxy_set(px, -1, "reset") != 0 || tu_proxy_set(px, -1, "pass") != 0)
		exit(2);
}

/* ---------------------------------------------------------------- helpers */

/* A store whose every connection goes through the proxy; requests and
 * reconnects bounded by 500 ms. */
static dlock_store *open_proxied(void)
{
	return nu_openf("%s?timeout=500ms&connect_timeout=500ms", px_uri);
}

/* Nodes of client `cid` under /dlock/<name>, read directly from the server. */
static int count_own(const char *name, const char *cid)
{
	char dir[512], want[64];
	snprintf(dir, sizeof(dir), "/dlock/%s", name);
	snprintf(want, sizeof(want), "_c_%s-", cid);
	struct String_vector sv = { 0, NULL };
	int r = zoo_get_children(raw, dir, 0, &sv);
	if (r == ZNONODE)
		return 0;
	if (r != ZOK)
		return -1;
	int n = 0;
	for (int i = 0; i < sv.count; i++)
		n += strncmp(sv.data[i], want, strlen(want)) == 0;
	deallocate_String_vector(&sv);
	return n;
}

static void name_of(char *buf, size_t n, const char *what)
{
	snprintf(buf, n, "%s-%s", what, run_id);
}

/* Flip the proxy dark after `ms` (from a thread of its own); with
 * light_after, back to pass that long after the start. */
static long long dark_at, light_after;
static int light_reset; /* ...and cut the connections then */
static void *go_dark(void *arg)
{
	long long t0 = tu_now_ms();
	usleep((useconds_t)(intptr_t)arg * 1000);
	dark_at = tu_now_ms();
	px_set_dark(1);
	if (light_after > 0) {
		long long left = t0 + light_after - tu_now_ms();
		if (left > 0)
			usleep((useconds_t)left * 1000);
		px_set_dark(0);
		if (light_reset)
			px_reset();
	}
	return NULL;
}

/* ---------------------------------------------------------------- cases */

/* Open against a dark link: bounded by connect_timeout, not by the
 * library's own session handshake timeout. */
static void case_open_dark(void)
{
	px_set_dark(1);
	dlock_store *s = NULL;
	char u[1200];
	snprintf(u, sizeof(u), "%s?connect_timeout=500ms", px_uri);
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_store_open(&s, u), DLOCK_EUNAVAILABLE);
	long long took = tu_now_ms() - t0;
	printf("  open with connect_timeout=500ms on a dark link returned after %lld ms\n", took);
	CHECK(took <= 500 + TU_SCHED_GRACE_MS);
	px_set_dark(0);
}

/* acquire --wait 1s on a dark link, the name free or held by another:
 * returns within the wait + the scheduling grace measured in the run. */
static void case_acquire_dark(void)
{
	char name[64];
	name_of(name, sizeof(name), "acqdark");
	dlock_store *hs = nu_openf("%s", direct_uri);
	dlock_lock *h = nu_lock_cb(hs, name, 4000, NULL);
	dlock_store *s = open_proxied();
	dlock_lock *l = nu_lock_cb(s, name, 4000, NULL);
	long long worst = 0;
	for (int held = 0; held < 2; held++) {
		if (held)
			CHECK_RC(dlock_acquire(h, 0), 0);
		px_set_dark(1);
		long long t0 = tu_now_ms();
		int rc = dlock_acquire(l, 1000);
		long long took = tu_now_ms() - t0;
		CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);
		CHECK(took <= 1000 + TU_SCHED_GRACE_MS);
		if (took > worst)
			worst = took;
		printf("  acquire(wait 1000) on a dark link, name %s: %s after %lld ms\n", held ? "held" : "free",
		       dlock_error_name(rc), took);
		px_set_dark(0);
		if (held)
			CHECK_RC(dlock_release(h), 0);
	}
	/* The link is back: the tries left nothing that blocks (swept). */
	CHECK_RC(dlock_acquire(h, 6000), 0);
	CHECK_RC(dlock_release(h), 0);
	dlock_lock_free(l);
	dlock_lock_free(h);
	dlock_store_close(s);
	dlock_store_close(hs);
}

/* The link goes dark while the acquire waits in line (its watch set): it
 * still returns by its wait + the run's scheduling grace. */
static void case_acquire_dark_midwait(void)
{
	char name[64];
	name_of(name, sizeof(name), "midwait");
	dlock_store *hs = nu_openf("%s", direct_uri);
	dlock_lock *h = nu_lock_cb(hs, name, 4000, NULL);
	CHECK_RC(dlock_acquire(h, 0), 0);
	dlock_store *s = open_proxied();
	dlock_lock *l = nu_lock_cb(s, name, 4000, NULL);
	pthread_t t;
	pthread_create(&t, NULL, go_dark, (void *)(intptr_t)400);
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(l, 1000);
	long long took = tu_now_ms() - t0;
	pthread_join(t, NULL);
	printf("  acquire(wait 1000), link dark after %lld ms: %s after %lld ms\n", dark_at - t0, dlock_error_name(rc),
	       took);
	CHECK(rc == DLOCK_ETIMEOUT || rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 1000 + TU_SCHED_GRACE_MS);
	px_set_dark(0);
	CHECK_RC(dlock_release(h), 0);
	dlock_lock_free(l);
	dlock_lock_free(h);
	dlock_store_close(s);
	dlock_store_close(hs);
}

/* extend and status on a dark link: within timeout= (500 ms) + the run's scheduling grace. */
static void case_extend_status_dark(void)
{
	char name[64];
	name_of(name, sizeof(name), "extdark");
	dlock_store *s = open_proxied();
	dlock_lock *l = nu_lock_cb(s, name, 4000, NULL);
	CHECK_RC(dlock_acquire(l, 0), 0);
	px_set_dark(1);
	long long t0 = tu_now_ms();
	int rc = dlock_extend(l, 4000);
	long long took = tu_now_ms() - t0;
	printf("  extend on a dark link: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 500 + TU_SCHED_GRACE_MS);
	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	t0 = tu_now_ms();
	rc = dlock_store_status(s, names, 1, &st, &n);
	took = tu_now_ms() - t0;
	printf("  status on a dark link: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 500 + TU_SCHED_GRACE_MS);
	dlock_status_free(st, n);
	t0 = tu_now_ms();
	rc = dlock_store_status(s, NULL, 0, &st, &n);
	took = tu_now_ms() - t0;
	printf("  status (list) on a dark link: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 500 + TU_SCHED_GRACE_MS);
	dlock_status_free(st, n);
	px_set_dark(0);
	dlock_release(l);
	dlock_lock_free(l);
	dlock_store_close(s);
}

/* Wait, with nothing else done in this process, until client cid has no
 * node under name; @return ms from `since`, or -1 after `limit` ms. */
static long long gone_after(const char *name, const char *cid, long long since, long long limit)
{
	while (tu_now_ms() - since < limit) {
		if (count_own(name, cid) == 0)
			return tu_now_ms() - since;
		usleep(20000);
	}
	return -1;
}

/* A release whose delete is lost on a dark link returns by timeout= +
 * 50 ms. Once the link is back the node goes with no further call of ours
 * (the session watcher sweeps it when the session is connected again),
 * within one session timeout, and another client gets the lock. `reset`:
 * the link comes back 800 ms after the release and the proxy cuts its
 * connections (the client reconnects at once); otherwise it stays dark for
 * 3.2 s, past 2/3 of the session timeout when the library gives the
 * connection up by itself. */
static void release_dark(int reset)
{
	char name[64];
	name_of(name, sizeof(name), reset ? "reldark" : "reldarklong");
	const int64_t ttl = 4000; /* session timeout 4 s */
	dlock_store *s = open_proxied();
	dlock_lock *l = nu_lock_cb(s, name, ttl, NULL);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK(count_own(name, dlock_store_client_id(s)) == 1);
	px_set_dark(1);
	long long t0 = tu_now_ms();
	int rc = dlock_release(l);
	long long took = tu_now_ms() - t0;
	printf("  release on a dark link: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 500 + TU_SCHED_GRACE_MS);
	CHECK(count_own(name, dlock_store_client_id(s)) == 1); /* the delete never arrived */
	long long light = t0 + (reset ? 800 : 3200);
	if (light > tu_now_ms())
		usleep((useconds_t)(light - tu_now_ms()) * 1000);
	px_set_dark(0);
	if (reset)
		px_reset();
	long long gone = gone_after(name, dlock_store_client_id(s), t0, ttl + 2000);
	printf("  link back at %lld ms%s: the node was gone at %lld ms (session timeout %lld ms), process idle\n",
	       light - t0, reset ? " (connections cut)" : "", gone, (long long)ttl);
	CHECK(gone >= 0 && gone <= ttl + 300); /* expiry: last heard + timeout, up to a tick (100 ms) later */
	if (reset) /* reconnected at once: swept at once, long before the session could expire */
		CHECK(gone >= 0 && gone <= light - t0 + 1000);
	dlock_store *os = nu_openf("%s", direct_uri);
	dlock_lock *o = nu_lock_cb(os, name, 4000, NULL);
	CHECK_RC(dlock_acquire(o, 0), 0);
	CHECK_RC(dlock_release(o), 0);
	dlock_lock_free(o);
	dlock_store_close(os);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void case_release_dark(void)
{
	release_dark(1);
}

static void case_release_dark_long(void)
{
	release_dark(0);
}

/* A waiter that gives up while its link is dark: the cancel's delete is
 * lost. Once the link is back (and cut, so the client reconnects at once),
 * with this process idle, its queue node goes by itself, so the name is
 * free for others as soon as the holder leaves. */
static void case_cancel_dark(void)
{
	char name[64];
	name_of(name, sizeof(name), "canceldark");
	const int64_t ttl = 4000;
	dlock_store *hs = nu_openf("%s", direct_uri);
	dlock_lock *h = nu_lock_cb(hs, name, ttl, NULL);
	CHECK_RC(dlock_acquire(h, 0), 0);
	dlock_store *s = open_proxied();
	dlock_lock *l = nu_lock_cb(s, name, ttl, NULL);
	pthread_t t;
	light_after = 1500; /* then the proxy cuts the connections: the client reconnects at once */
	light_reset = 1;
	pthread_create(&t, NULL, go_dark, (void *)(intptr_t)600);
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(l, 800);
	long long took = tu_now_ms() - t0;
	printf("  waiter (wait 800), link dark at %lld ms: %s after %lld ms\n", dark_at - t0, dlock_error_name(rc),
	       took);
	CHECK(rc == DLOCK_ETIMEOUT || rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 800 + TU_SCHED_GRACE_MS);
	CHECK(count_own(name, dlock_store_client_id(s)) == 1); /* its queue node, left behind */
	pthread_join(t, NULL);
	light_after = 0;
	light_reset = 0;
	long long back = tu_now_ms();
	CHECK_RC(dlock_release(h), 0);
	dlock_store *os = nu_openf("%s", direct_uri);
	dlock_lock *o = nu_lock_cb(os, name, ttl, NULL);
	rc = dlock_acquire(o, ttl + 2000);
	long long granted = tu_now_ms() - back;
	printf("  another client granted %lld ms after the link came back (%s; session timeout %lld ms)\n", granted,
	       dlock_error_name(rc), (long long)ttl);
	CHECK_RC(rc, 0);
	CHECK(granted <= 1000); /* swept on reconnect, not left to the session's expiry */
	CHECK(count_own(name, dlock_store_client_id(s)) == 0);
	if (rc == 0)
		CHECK_RC(dlock_release(o), 0);
	dlock_lock_free(o);
	dlock_store_close(os);
	dlock_lock_free(l);
	dlock_lock_free(h);
	dlock_store_close(s);
	dlock_store_close(hs);
}

/* A try whose create is applied but whose reply is dropped (the proxy
 * forwards requests and swallows answers): the acquire returns by its
 * request timeout with the outcome unknown, and the node it made goes
 * without any further call once replies flow again, long before the
 * library would notice the lost reply by itself (2/3 of an 8 s session):
 * the sweeper's probe gets an answer ahead of the lost one, the library
 * reconnects, and the watcher sweeps. */
static void case_create_reply_dropped(void)
{
	char name[64];
	name_of(name, sizeof(name), "dropped");
	const int64_t ttl = 8000;
	dlock_store *s = open_proxied();
	dlock_lock *l = nu_lock_cb(s, name, ttl, NULL);
	/* a first grant and release, so the name's parents exist */
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_release(l), 0);
	if (tu_proxy_set(px, -1, "drop") != 0)
		exit(2);
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(l, 0);
	long long took = tu_now_ms() - t0;
	printf("  try-once whose reply is dropped: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 500 + TU_SCHED_GRACE_MS);
	CHECK(count_own(name, dlock_store_client_id(s)) == 1); /* made, unanswered */
	usleep(300000);
	px_set_dark(0);
	long long back = tu_now_ms();
	long long gone = gone_after(name, dlock_store_client_id(s), back, 5000);
	printf("  replies flow again: the node was gone %lld ms later, process idle (session timeout %lld ms)\n", gone,
	       (long long)ttl);
	CHECK(gone >= 0 && gone <= 1500);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static atomic_llong lost_at;

static void note_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	lost_at = tu_now_ms();
}

static dlock_lock *waiter;
static atomic_llong waiter_granted;
static int waiter_rc;

static void *waiter_main(void *unused)
{
	(void)unused;
	waiter_rc = dlock_acquire(waiter, 15000);
	waiter_granted = tu_now_ms();
	if (waiter_rc == 0)
		dlock_release(waiter);
	return NULL;
}

/* A holder whose link goes dark: on_lost no later than its lease deadline
 * + 20 ms, and before the other client is granted (which needs the server
 * to expire the holder's session: at least one session timeout >= ttl after
 * the server last heard from it). */
static void case_lost_dark(void)
{
	char name[64];
	name_of(name, sizeof(name), "lostdark");
	const int64_t ttl = 2000; /* session timeout 2 s */
	dlock_store *s = open_proxied();
	dlock_lock *l = nu_lock_cb(s, name, ttl, note_lost);
	lost_at = 0;
	waiter_granted = 0;
	CHECK_RC(dlock_acquire(l, 0), 0);
	dlock_store *ws = nu_openf("%s", direct_uri);
	waiter = nu_lock_cb(ws, name, 4000, NULL);
	pthread_t t;
	pthread_create(&t, NULL, waiter_main, NULL);
	long long until = tu_now_ms() + 5000;
	while (nu_waiters(ws, name) < 1 && tu_now_ms() < until)
		usleep(5000);
	usleep(100000);
	long long cut = tu_now_ms();
	long long deadline = cut + dlock_ttl_left(l);
	px_set_dark(1);
	pthread_join(t, NULL);
	printf("  dark at 0 ms: lease deadline %lld ms, on_lost at %lld ms, waiter granted at %lld ms\n",
	       deadline - cut, lost_at ? lost_at - cut : -1, waiter_granted - cut);
	CHECK_RC(waiter_rc, 0);
	CHECK(lost_at > 0 && lost_at <= deadline + TU_SCHED_GRACE_MS);
	CHECK(lost_at > 0 && lost_at < waiter_granted);
	CHECK(!dlock_held(l));
	px_set_dark(0);
	dlock_release(l);
	dlock_lock_free(waiter);
	dlock_lock_free(l);
	dlock_store_close(ws);
	dlock_store_close(s);
}

static const tu_case cases[] = {
	{ "open_dark", case_open_dark },
	{ "acquire_dark", case_acquire_dark },
	{ "acquire_dark_midwait", case_acquire_dark_midwait },
	{ "extend_status_dark", case_extend_status_dark },
	{ "release_dark", case_release_dark },
	{ "release_dark_long", case_release_dark_long },
	{ "cancel_dark", case_cancel_dark },
	{ "create_reply_dropped", case_create_reply_dropped },
	{ "lost_dark", case_lost_dark },
};

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	tu_uri_from_env(direct_uri, sizeof(direct_uri), "zookeeper_time");
	if (sscanf(direct_uri, "zk://%255[^/?]", server_hp) != 1 || !strchr(server_hp, ':')) {
		fprintf(stderr, "zookeeper_time: want a zk://host:port URI, got %s\n", direct_uri);
		return 2;
	}
	snprintf(run_id, sizeof(run_id), "%08x", (unsigned)(tu_now_ms() ^ (getpid() << 16)));
	zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
	raw = zookeeper_init(server_hp, NULL, 30000, NULL, NULL, 0);
	long long until = tu_now_ms() + 10000;
	while (raw && zoo_state(raw) != ZOO_CONNECTED_STATE && tu_now_ms() < until)
		usleep(10000);
	if (!raw || zoo_state(raw) != ZOO_CONNECTED_STATE) {
		fprintf(stderr, "zookeeper_time: cannot connect to %s\n", server_hp);
		return 2;
	}
	if (!(px = tu_proxy_start(direct_uri, &px_uri))) {
		fprintf(stderr, "zookeeper_time: the fault proxy did not start\n");
		return 2;
	}
	tu_run_cases(cases, sizeof(cases) / sizeof(cases[0]), argc, argv, 3);
	zookeeper_close(raw);
	tu_proxy_stop(px);
	free(px_uri);
	return tu_done("zookeeper_time");
}
