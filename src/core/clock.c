#include "core/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

static int64_t ms_of(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t dlock_clock_ms(void)
{
	return ms_of(CLOCK_MONOTONIC);
}

int64_t dlock_wall_ms(void)
{
	return ms_of(CLOCK_REALTIME);
}

void dlock_sys_sleep_ms(int64_t ms)
{
	if (ms <= 0)
		return;
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

void dlock_sys_abstime(struct timespec *ts, int64_t ms_from_now)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	if (ms_from_now < 0)
		ms_from_now = 0;
	if (ms_from_now > (int64_t)86400 * 1000 * 365)
		ms_from_now = (int64_t)86400 * 1000 * 365;
	ts->tv_sec += (time_t)(ms_from_now / 1000);
	ts->tv_nsec += (long)(ms_from_now % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

void dlock_random(void *buf, size_t len)
{
	unsigned char *p = buf;
	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			abort(); /* no entropy: refusing beats handing out guessable owner ids */
		}
		p += n;
		len -= (size_t)n;
	}
}

/* Jitter and tie-breaks need spread, not secrecy: a per-thread xorshift
 * seeded once from getrandom (a getrandom call per acquire was a syscall on
 * every lock), mixed with the monotonic clock so that the two sides of a
 * fork part at once. */
int64_t dlock_sys_rand_between(int64_t lo, int64_t hi)
{
	static _Thread_local uint64_t st;
	if (hi <= lo)
		return lo;
	if (st == 0) {
		dlock_random(&st, sizeof(st));
		st |= 1;
	}
	st ^= st << 13;
	st ^= st >> 7;
	st ^= st << 17;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t r = st ^ ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull);
	return lo + (int64_t)(r % (uint64_t)(hi - lo + 1));
}

int64_t dlock_sys_drift_ms(int64_t ttl_ms)
{
	return ttl_ms / 100 + 2;
}
