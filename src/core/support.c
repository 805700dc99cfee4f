/* support.c — the small helpers that stores share (src/stores/support.h). */
#include "core/internal.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t dlock_sys_fnv1a64(uint64_t h, const void *p, size_t n)
{
	const unsigned char *s = p;
	for (size_t i = 0; i < n; i++) {
		h ^= s[i];
		h *= 1099511628211ULL;
	}
	return h;
}

struct timeval dlock_sys_ms_timeval(int64_t ms)
{
	if (ms < 0)
		ms = 0;
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000) };
	return tv;
}

int dlock_sys_cond_init_monotonic(pthread_cond_t *cv)
{
	pthread_condattr_t ca;
	int rc = pthread_condattr_init(&ca);
	if (rc)
		return rc;
	rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (rc == 0)
		rc = pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
	return rc;
}

int dlock_sys_opt_dup(char **dst, const char *v)
{
	*dst = NULL;
	if (!v)
		return 0;
	*dst = dlock_sys_strdup(v);
	return *dst ? 0 : DLOCK_ENOMEM;
}

static int sb_reserve(dlock_sys_sbuf *s, size_t more)
{
	if (s->failed)
		return -1;
	if (s->limit && (more > s->limit || s->len > s->limit - more)) {
		s->failed = 2;
		return -1;
	}
	if (s->len + more + 1 <= s->cap)
		return 0;
	size_t cap = s->cap ? s->cap : 512;
	while (cap < s->len + more + 1)
		cap *= 2;
	char *n = realloc(s->p, cap);
	if (!n) {
		s->failed = 1;
		return -1;
	}
	s->p = n;
	s->cap = cap;
	return 0;
}

int dlock_sys_sb_put(dlock_sys_sbuf *s, const void *bytes, size_t n)
{
	if (sb_reserve(s, n))
		return -1;
	memcpy(s->p + s->len, bytes, n);
	s->len += n;
	s->p[s->len] = '\0';
	return 0;
}

int dlock_sys_sb_add(dlock_sys_sbuf *s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0) {
		if (!s->failed)
			s->failed = 1;
		return -1;
	}
	if (sb_reserve(s, (size_t)n))
		return -1;
	va_start(ap, fmt);
	vsnprintf(s->p + s->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	s->len += (size_t)n;
	return 0;
}

bool dlock_sys_host_is_local(const char *host)
{
	if (!host || !*host || host[0] == '/' || strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 ||
	    strcmp(host, "[::1]") == 0)
		return true;
	unsigned a, b, c, d;
	char extra;
	return sscanf(host, "%u.%u.%u.%u%c", &a, &b, &c, &d, &extra) == 4 && a == 127 && b < 256 && c < 256 && d < 256;
}

static _Thread_local char open_warning[512];

void dlock_sys_open_warning(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(open_warning, sizeof(open_warning), fmt, ap);
	va_end(ap);
}

void dlock__open_warning_take(char *buf, size_t size)
{
	snprintf(buf, size, "%s", open_warning);
	open_warning[0] = '\0';
}

static int word_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

void dlock_sys_scrub(char *msg, size_t size, const char *secret)
{
	size_t pl = secret ? strlen(secret) : 0;
	if (pl == 0 || !msg)
		return;
	char out[1024];
	size_t o = 0;
	for (const char *p = msg; *p && o + 4 < sizeof(out);) {
		if (strncmp(p, secret, pl) == 0 && (p == msg || !word_char(p[-1]) || !word_char(secret[0])) &&
		    (!word_char(p[pl]) || !word_char(secret[pl - 1]))) {
			memcpy(out + o, "***", 3);
			o += 3;
			p += pl;
		} else {
			out[o++] = *p++;
		}
	}
	out[o] = '\0';
	snprintf(msg, size, "%s", out);
}

void dlock_sys_nopipe_begin(dlock_sys_nopipe *np)
{
	sigset_t pipe, pending;
	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	sigemptyset(&pending);
	sigpending(&pending);
	np->was_pending = sigismember(&pending, SIGPIPE) == 1;
	pthread_sigmask(SIG_BLOCK, &pipe, &np->old);
}

void dlock_sys_nopipe_end(dlock_sys_nopipe *np)
{
	sigset_t pipe, pending;
	sigemptyset(&pending);
	if (!np->was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
		sigemptyset(&pipe);
		sigaddset(&pipe, SIGPIPE);
		struct timespec zero = { 0, 0 };
		while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR)
			;
	}
	pthread_sigmask(SIG_SETMASK, &np->old, NULL);
}

void dlock_sys_sock_states(const int *fds, size_t n, int *states)
{
	struct pollfd p[64];
	if (n > 64)
		n = 64;
	for (size_t i = 0; i < n; i++)
		p[i] = (struct pollfd){ .fd = fds[i], .events = POLLIN | POLLRDHUP };
	int r = poll(p, n, 0);
	for (size_t i = 0; i < n; i++)
		states[i] = fds[i] < 0                                                  ? 2
			    : r <= 0 || !p[i].revents                                   ? 0
			    : p[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL) ? 2
											: 1;
}

int64_t dlock_sys_poll_hint(int64_t ahead, int64_t per_place_ms)
{
	/* the next in line is the next head; further back, a waiter needs about
	 * `ahead` handoffs to reach the front: it looks less often */
	if (ahead <= 1)
		return ahead <= 0 ? 1 : 2;
	return per_place_ms * ahead < 16 ? per_place_ms * ahead : 16;
}
