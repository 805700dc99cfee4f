/*
 * demo.c — `dlock demo`: the access-token race (docs/cli.md, "dlock demo").
 *
 * A stand-in for a remote token API lives in shared memory: fetching a token
 * invalidates the previous one, and a token expires after TOKEN_USES
 * messages. Worker processes share a token cache and keep using the token
 * they have until a message is refused. Then a worker reads the cache: if it
 * holds a different token, it takes that one; if not (nobody refreshed yet)
 * it fetches a new token, API_LATENCY_MS later, and stores it in the cache.
 *
 * Without a lock, every worker that saw "expired" refreshes at once: each
 * fetch invalidates the token another worker just received, and messages
 * sent with those tokens are rejected as stale. With the refresh done under
 * a dlock lock (read the cache again inside it), the only token ever
 * replaced is one that has already expired, so no message can be rejected
 * as stale: zero by construction, not by luck of timing.
 */
#include "cli.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WORKERS 5
#define MESSAGES 40        /* per worker and phase */
#define TOKEN_USES 20      /* messages a token is good for */
#define API_LATENCY_MS 20  /* from deciding to refresh to the API issuing the token */
#define MAX_TOKENS 4096

static const char help[] =
	"Usage: dlock demo\n"
	"\n"
	"The access-token race, told in a few seconds on the default store (or\n"
	"--store / $DLOCK_STORE). Several worker processes send messages through a\n"
	"local stand-in for an API that needs an access token; fetching a new token\n"
	"invalidates the old one. First the workers refresh the shared token without\n"
	"a lock (messages get rejected for a stale token), then each refresh runs\n"
	"under a dlock lock (none do). Prints both counts and a one-line verdict.\n"
	"With --json: {\"store\",\"workers\",\"messages\",\"unlocked\":{\"rejected\",\"fetches\"},\n"
	"\"locked\":{\"rejected\",\"fetches\"},\"verdict\"}.\n"
	"\n%s"
	"\nExit codes: 0 the lock prevented every stale-token failure; 1 it did not;\n"
	"69 store unavailable.\n";

enum { SENT_OK, SENT_STALE, SENT_EXPIRED };

typedef struct service {
	pthread_mutex_t mu;              /* the API server's own consistency */
	uint64_t current;                /* the one valid token */
	unsigned uses;                   /* messages accepted with it */
	unsigned char expired[MAX_TOKENS]; /* replaced tokens: expired when replaced? */
	atomic_ullong cache;             /* the workers' shared token cache */
	atomic_uint stale, fetches, accepted;
} service;

static void pause_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static uint64_t api_fetch(service *s)
{
	pthread_mutex_lock(&s->mu);
	if (s->current < MAX_TOKENS)
		s->expired[s->current] = s->uses >= TOKEN_USES;
	uint64_t t = ++s->current;
	s->uses = 0;
	pthread_mutex_unlock(&s->mu);
	atomic_fetch_add(&s->fetches, 1);
	return t;
}

static int api_send(service *s, uint64_t token)
{
	int r;
	pthread_mutex_lock(&s->mu);
	if (token == s->current)
		r = s->uses >= TOKEN_USES ? SENT_EXPIRED : (s->uses++, SENT_OK);
	else if (token < MAX_TOKENS && s->expired[token])
		r = SENT_EXPIRED;
	else
		r = SENT_STALE; /* replaced while still good: someone else's refresh broke it */
	pthread_mutex_unlock(&s->mu);
	return r;
}

/* One worker process: MESSAGES messages, refreshing the token when told to. */
static int worker(const cli_global *g, service *s, const char *uri, const char *lock_name, bool locked)
{
	dlock_store *store = NULL;
	dlock_lock *lock = NULL;
	int rc = 0;
	if (locked) {
		int err = dlock_store_open(&store, uri);
		if (err == 0)
			err = dlock_lock_new(&lock, store, lock_name, NULL);
		if (err != 0) {
			rc = cli_fail(g, err, "worker");
			goto out;
		}
	}
	uint64_t token = atomic_load(&s->cache);
	for (int sent = 0; sent < MESSAGES;) {
		int r = api_send(s, token);
		if (r == SENT_OK) {
			sent++;
			atomic_fetch_add(&s->accepted, 1);
			pause_ms(2); /* the work between two messages */
			continue;
		}
		if (r == SENT_STALE)
			atomic_fetch_add(&s->stale, 1);
		/* Refresh: read the cache; fetch only if nobody has replaced our token yet. */
		if (locked) {
			int err = dlock_acquire(lock, 10000);
			if (err != 0) {
				rc = cli_fail(g, err, "worker: acquire");
				goto out;
			}
		}
		uint64_t cached = atomic_load(&s->cache);
		if (cached == token) {
			pause_ms(API_LATENCY_MS);
			token = api_fetch(s);
			atomic_store(&s->cache, token);
		} else {
			token = cached;
		}
		if (locked) {
			int err = dlock_release(lock);
			if (err != 0) {
				rc = cli_fail(g, err, "worker: release");
				goto out;
			}
		}
	}
out:
	dlock_lock_free(lock);
	dlock_store_close(store);
	return rc;
}

typedef struct phase_result {
	unsigned stale, fetches, accepted;
} phase_result;

static int run_phase(const cli_global *g, service *s, const char *uri, const char *lock_name, bool locked,
		     phase_result *res)
{
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	memset(s, 0, sizeof *s);
	pthread_mutex_init(&s->mu, &ma);
	pthread_mutexattr_destroy(&ma);
	atomic_store(&s->cache, api_fetch(s));
	atomic_store(&s->fetches, 0);

	pid_t pids[WORKERS];
	int n = 0, rc = 0;
	fflush(NULL);
	for (; n < WORKERS; n++) {
		pids[n] = fork();
		if (pids[n] < 0) {
			cli_error(g, "fork: %s", strerror(errno));
			rc = CLI_EXIT_FAIL;
			break;
		}
		if (pids[n] == 0)
			_exit(worker(g, s, uri, lock_name, locked));
	}
	for (int i = 0; i < n; i++) {
		int st;
		while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR)
			;
		int code = WIFEXITED(st) ? WEXITSTATUS(st) : CLI_EXIT_FAIL;
		if (code != 0 && rc == 0)
			rc = code;
	}
	pthread_mutex_destroy(&s->mu);
	res->stale = atomic_load(&s->stale);
	res->fetches = atomic_load(&s->fetches);
	res->accepted = atomic_load(&s->accepted);
	return rc;
}

int cli_demo(cli_global *g, int argc, char **argv)
{
	cli_args a;
	int rc = cli_parse(g, argc, argv, NULL, NULL, NULL, &a);
	if (rc == 0 && a.help) {
		printf(help, cli_global_help);
		free(a.pos);
		return 0;
	}
	if (rc == 0 && (a.npos || a.dashdash))
		rc = cli_usage_error(g, "demo takes no arguments");
	free(a.pos);
	if (rc != 0)
		return rc;

	/* Open once here so that a bad store fails before any worker starts. */
	dlock_store *store = NULL;
	if ((rc = cli_store_open(g, &store)) != 0)
		return rc;
	const char *chosen = cli_store_choice(g); /* the store just opened (NULL: the local file) */
	char *uri = strdup(chosen ? chosen : "");
	char *shown = strdup(dlock_store_uri(store));
	/* Workers open their own: a store with threads must not cross fork(). */
	dlock_store_close(store);
	char host[128] = "host";
	gethostname(host, sizeof host - 1);
	char lock_name[200];
	snprintf(lock_name, sizeof lock_name, "dlock-demo/token-refresh/%s/%d", host, (int)getpid());

	service *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (!uri || !shown || s == MAP_FAILED) {
		cli_error(g, "out of memory");
		free(uri);
		free(shown);
		return CLI_EXIT_FAIL;
	}
	bool text = !g->json && g->verbosity >= 0;
	if (text) {
		printf("dlock demo: %d workers send %d messages each through one token API.\n"
		       "Fetching a new token invalidates the old one; a token is good for %d messages.\n"
		       "store: %s   lock: %s\n\n",
		       WORKERS, MESSAGES, TOKEN_USES, shown, lock_name);
		fflush(stdout);
	}
	phase_result un = { 0 }, lk = { 0 };
	int64_t t0 = cli_mono_ms();
	rc = run_phase(g, s, uri, lock_name, false, &un);
	if (rc == 0 && text) {
		printf("  without a lock: %3u of %d messages rejected for a stale token (%u token fetches)\n", un.stale,
		       WORKERS * MESSAGES, un.fetches);
		fflush(stdout);
	}
	if (rc == 0)
		rc = run_phase(g, s, uri, lock_name, true, &lk);
	int64_t took = cli_mono_ms() - t0;
	if (rc == 0 && text)
		printf("  with dlock:     %3u of %d messages rejected for a stale token (%u token fetches)\n\n",
		       lk.stale, WORKERS * MESSAGES, lk.fetches);
	const char *verdict = NULL;
	if (rc == 0) {
		if (lk.stale > 0) {
			verdict = "fail";
			rc = CLI_EXIT_FAIL;
		} else {
			verdict = un.stale > 0 ? "pass" : "no-race";
		}
	}
	if (rc == 0 || verdict) {
		if (g->json) {
			fputs("{\"store\":", stdout);
			cli_json_str(stdout, shown);
			printf(",\"workers\":%d,\"messages\":%d,\"unlocked\":{\"rejected\":%u,\"fetches\":%u},"
			       "\"locked\":{\"rejected\":%u,\"fetches\":%u},\"ms\":%lld,\"verdict\":\"%s\"}\n",
			       WORKERS, WORKERS * MESSAGES, un.stale, un.fetches, lk.stale, lk.fetches, (long long)took,
			       verdict);
		} else if (lk.stale > 0) {
			printf("verdict: FAIL: %u messages were rejected even under the lock.\n", lk.stale);
		} else if (un.stale > 0) {
			printf("verdict: without a lock, concurrent refreshes broke %u messages; with dlock, "
			       "none (%.1fs).\n",
			       un.stale, (double)took / 1000.0);
		} else {
			printf("verdict: no failures either way this time (the workers never refreshed at "
			       "once); run it again.\n");
		}
	}
	munmap(s, sizeof *s);
	free(uri);
	free(shown);
	return rc;
}
