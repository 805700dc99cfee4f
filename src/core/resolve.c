/*
 * Host name resolution by a deadline.
 *
 * getaddrinfo blocks for as long as the resolver likes (glibc: timeout ×
 * attempts × nameservers, 5 s × 2 × N by default) and cannot be cancelled.
 * So a name is resolved on a detached thread of its own and the caller waits
 * for it no longer than its deadline; a lookup that outlives every caller
 * finishes (or hangs) alone and frees itself. getaddrinfo_a was measured as
 * the alternative: glibc runs it on threads too, and a request in progress
 * cannot be cancelled (gai_cancel: EAI_NOTCANCELED) while its gaicb must
 * stay valid, so the caller would need the same ownership dance with less
 * control over it.
 *
 * A lookup in flight is shared: the reconnects of a store whose DNS hangs
 * wait for the one lookup already running instead of starting one thread
 * each, and a finished answer is kept for KEEP_MS so that a prefetch
 * (dlock_sys_resolve_prefetch) and the resolve that follows it meet.
 * Numeric hosts never leave the caller's thread (AI_NUMERICHOST).
 */
#include "internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define KEEP_MS 5000
#define KEEP_FAILED_MS 1000
#define HOST_MAX 256

typedef struct job {
	struct job *next;
	char host[HOST_MAX];
	pid_t pid;          /* a lookup of the parent is not running in a forked child */
	int refs;           /* waiters + the resolver thread + the list */
	bool done;
	int64_t done_at;
	int gai;            /* getaddrinfo's result */
	int sys_errno;
	dlock_sys_addrs addrs;
} job;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;
static job *jobs;

/* A child forked while another thread held mu must not inherit it locked. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&mu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&mu);
}

static void cv_make(void)
{
	dlock_sys_cond_init_monotonic(&cv);
}

/* The parent's waiters are not in the child: a condition variable that counts
 * them could make a broadcast there wait for them. Both start afresh. */
static void fork_child(void)
{
	pthread_mutex_init(&mu, NULL);
	cv_make();
}

static void cv_init(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
	cv_make();
}

static void addrs_from(dlock_sys_addrs *out, const struct addrinfo *res)
{
	out->n = 0;
	for (const struct addrinfo *ai = res; ai && out->n < DLOCK_SYS_ADDRS_MAX; ai = ai->ai_next) {
		char buf[DLOCK_SYS_ADDR_LEN];
		const void *a;
		if (ai->ai_family == AF_INET)
			a = &((const struct sockaddr_in *)(const void *)ai->ai_addr)->sin_addr;
		else if (ai->ai_family == AF_INET6)
			a = &((const struct sockaddr_in6 *)(const void *)ai->ai_addr)->sin6_addr;
		else
			continue;
		if (!inet_ntop(ai->ai_family, a, buf, sizeof(buf)))
			continue;
		bool dup = false;
		for (size_t i = 0; i < out->n && !dup; i++)
			dup = !strcmp(out->addr[i], buf);
		if (!dup)
			memcpy(out->addr[out->n++], buf, sizeof(buf));
	}
}

static int lookup(dlock_sys_addrs *out, const char *host, int flags, int *sys_errno)
{
	struct addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = flags;
	int gai = getaddrinfo(host, NULL, &hints, &res);
	*sys_errno = errno;
	if (gai == 0) {
		addrs_from(out, res);
		freeaddrinfo(res);
		if (out->n == 0)
			gai = EAI_NONAME;
	}
	return gai;
}

static void unref(job *j) /* under mu */
{
	if (--j->refs == 0)
		free(j);
}

static void *run(void *arg)
{
	job *j = arg;
	dlock_sys_addrs a;
	int err = 0;
	int gai = lookup(&a, j->host, 0, &err);
	pthread_mutex_lock(&mu);
	j->addrs = a;
	j->gai = gai;
	j->sys_errno = err;
	j->done = true;
	j->done_at = dlock_clock_ms();
	pthread_cond_broadcast(&cv);
	unref(j);
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* Drop finished lookups older than KEEP_MS and those of another process. Under mu. */
static void sweep(int64_t now)
{
	pid_t pid = getpid();
	for (job **p = &jobs; *p;) {
		job *j = *p;
		/* an answer is kept a while (prefetch and reconnects meet it), a failure briefly */
		if (j->pid != pid || (j->done && now - j->done_at > (j->gai ? KEEP_FAILED_MS : KEEP_MS))) {
			*p = j->next;
			if (j->pid == pid)
				unref(j);
			/* a parent's job has no thread here: its memory is left as it is */
		} else {
			p = &j->next;
		}
	}
}

/* The lookup of host, joined or started, with a reference for the caller; NULL on ENOMEM
 * or when no thread could be started (errno set). Under mu. */
static job *get(const char *host)
{
	int64_t now = dlock_clock_ms();
	sweep(now);
	for (job *j = jobs; j; j = j->next) {
		if (!strcmp(j->host, host)) {
			j->refs++;
			return j;
		}
	}
	job *j = calloc(1, sizeof(*j));
	if (!j) {
		errno = ENOMEM;
		return NULL;
	}
	snprintf(j->host, sizeof(j->host), "%s", host);
	j->pid = getpid();
	j->refs = 3; /* caller, thread, list */
	pthread_attr_t attr;
	pthread_t t;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int e = pthread_create(&t, &attr, run, j);
	pthread_attr_destroy(&attr);
	if (e) {
		free(j);
		errno = e;
		return NULL;
	}
	j->next = jobs;
	jobs = j;
	return j;
}

static bool passthrough(const char *host)
{
	return !host || !*host || host[0] == '/' || strlen(host) >= HOST_MAX;
}

void dlock_sys_resolve_prefetch(const char *host)
{
	dlock_sys_addrs a;
	int err;
	if (passthrough(host) || lookup(&a, host, AI_NUMERICHOST, &err) == 0)
		return;
	pthread_once(&cv_once, cv_init);
	pthread_mutex_lock(&mu);
	job *j = get(host);
	if (j)
		unref(j);
	pthread_mutex_unlock(&mu);
}

int dlock_sys_resolve(dlock_sys_addrs *out, const char *host, int64_t deadline_ms, const char *store)
{
	int err = 0;
	out->n = 0;
	out->timed_out = false;
	if (passthrough(host)) /* a socket path, or nothing a resolver could answer: n == 0 */
		return 0;
	if (lookup(out, host, AI_NUMERICHOST, &err) == 0)
		return 0;
	if (deadline_ms - dlock_clock_ms() <= 0) {
		out->timed_out = true;
		return dlock_error_set(DLOCK_EUNAVAILABLE, store, "ETIMEDOUT", "timed out resolving %s (no time left)",
				       host);
	}
	pthread_once(&cv_once, cv_init);
	pthread_mutex_lock(&mu);
	job *j = get(host);
	if (!j) {
		int e = errno;
		pthread_mutex_unlock(&mu);
		if (e == ENOMEM)
			return dlock_sys_oom();
		return dlock_error_set(DLOCK_EUNAVAILABLE, store, NULL, "cannot resolve %s: no thread: %s", host,
				       strerror(e));
	}
	struct timespec ts;
	ts.tv_sec = (time_t)(deadline_ms / 1000);
	ts.tv_nsec = (long)(deadline_ms % 1000) * 1000000L;
	while (!j->done && dlock_clock_ms() < deadline_ms) {
		if (pthread_cond_timedwait(&cv, &mu, &ts) == ETIMEDOUT)
			break;
	}
	bool done = j->done;
	int gai = j->gai, sys_errno = j->sys_errno;
	if (done)
		*out = j->addrs;
	unref(j);
	pthread_mutex_unlock(&mu);
	out->timed_out = !done;
	if (!done)
		return dlock_error_set(DLOCK_EUNAVAILABLE, store, "ETIMEDOUT", "timed out resolving %s", host);
	if (gai == 0)
		return 0;
	out->n = 0;
	return dlock_error_set(DLOCK_EUNAVAILABLE, store, gai == EAI_AGAIN ? "EAI_AGAIN" : "EAI",
			       "cannot resolve %s: %s", host,
			       gai == EAI_SYSTEM ? strerror(sys_errno) : gai_strerror(gai));
}

size_t dlock_sys_addrs_join(char *buf, size_t size, const dlock_sys_addrs *a, const char *sep)
{
	size_t len = 0;
	if (size)
		buf[0] = '\0';
	for (size_t i = 0; i < a->n; i++) {
		int w = snprintf(buf + len, size > len ? size - len : 0, "%s%s", i ? sep : "", a->addr[i]);
		if (w < 0)
			break;
		len += (size_t)w;
	}
	return len;
}

size_t dlock_sys_resolve_all(dlock_sys_addrs *out, int *rcs, const char *const *hosts, size_t n, int64_t deadline_ms,
			     const char *store)
{
	for (size_t i = 0; i < n; i++)
		dlock_sys_resolve_prefetch(hosts[i]);
	int64_t now = dlock_clock_ms();
	int64_t half = now + (deadline_ms - now) / 2;
	size_t ok = 0;
	dlock_sys_saved_error last = { 0 };
	for (int pass = 0; pass < 2 && !ok; pass++) {
		for (size_t i = 0; i < n; i++) {
			if (pass && rcs[i] != DLOCK_EUNAVAILABLE)
				continue; /* answered (or failed for good) in the first pass */
			rcs[i] = dlock_sys_resolve(&out[i], hosts[i], pass ? deadline_ms : half, store);
			if (rcs[i] == 0)
				ok++;
			else
				dlock_sys_error_save(&last);
		}
	}
	if (!ok && n)
		dlock_sys_error_restore(&last);
	return ok;
}
