#include "core/internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

static int64_t ms_of(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The simulated clock (dlock__clock_simulate, for the core's tests): while
 * on, dlock_clock_ms reads sim_ms, which only dlock__clock_advance moves.
 * Timed waits still sleep on real condition variables, so dlock_sys_abstime
 * caps each at SIM_LOOK_MS of real time: their loops look at the clock again
 * and go back to sleep until it has reached what they wait for. */
#define SIM_LOOK_MS 1
static atomic_bool sim_on;
static _Atomic int64_t sim_ms;
static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sim_cv = PTHREAD_COND_INITIALIZER; /* sim_ms moved */

void dlock__clock_simulate(bool on, int64_t start_ms)
{
	pthread_mutex_lock(&sim_mu);
	if (on) { /* the time first, then the switch: no reader sees a stale time */
		atomic_store(&sim_ms, start_ms);
		atomic_store(&sim_on, true);
	} else {
		atomic_store(&sim_on, false);
	}
	pthread_cond_broadcast(&sim_cv);
	pthread_mutex_unlock(&sim_mu);
}

void dlock__clock_advance(int64_t ms)
{
	pthread_mutex_lock(&sim_mu);
	atomic_fetch_add(&sim_ms, ms > 0 ? ms : 0);
	pthread_cond_broadcast(&sim_cv);
	pthread_mutex_unlock(&sim_mu);
}

int64_t dlock_clock_ms(void)
{
	if (atomic_load_explicit(&sim_on, memory_order_acquire))
		return atomic_load(&sim_ms);
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
	if (atomic_load_explicit(&sim_on, memory_order_acquire)) {
		pthread_mutex_lock(&sim_mu);
		int64_t until = atomic_load(&sim_ms) + ms;
		while (atomic_load(&sim_on) && atomic_load(&sim_ms) < until)
			pthread_cond_wait(&sim_cv, &sim_mu);
		pthread_mutex_unlock(&sim_mu);
		return;
	}
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

void dlock_sys_abstime(struct timespec *ts, int64_t ms_from_now)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	if (ms_from_now < 0)
		ms_from_now = 0;
	if (ms_from_now > SIM_LOOK_MS && atomic_load_explicit(&sim_on, memory_order_acquire))
		ms_from_now = SIM_LOOK_MS;
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
