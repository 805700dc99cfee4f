/* check_worker.c — a `dlock check` worker: acquire, read and write the
 * register with the fence, hold, release; every step logged (check.h). */
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>

static void logf_line(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_line(int fd, const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof buf)
		n = sizeof buf - 1;
	/* One write per line: O_APPEND keeps lines of many processes whole. */
	ssize_t w;
	do
		w = write(fd, buf, (size_t)n);
	while (w < 0 && errno == EINTR);
}

static int open_store(const run_ctx *c, int w_slot, dlock_store **out)
{
	return dlock_store_open(out, c->worker_uri[w_slot] ? c->worker_uri[w_slot] : c->uri);
}

/* ---- workers ------------------------------------------------------------ */

typedef struct worker_id {
	int log_fd;
	int slot, inc;
	atomic_llong seq;
} worker_id;

static void on_lost(dlock_lock *lock, void *payload)
{
	(void)lock;
	worker_id *w = payload;
	logf_line(w->log_fd, "L %d %d %lld %lld\n", w->slot, w->inc, (long long)atomic_load(&w->seq),
		  (long long)check_now_us());
}

static int worker_main(const run_ctx *c, int slot, int inc)
{
	const check_opts *o = c->o;
	worker_id w = { c->log_fd, slot, inc, 0 };
	dlock_store *store = NULL;
	dlock_lock *lock = NULL;
	uint64_t rs = (uint64_t)getpid() * 7919u + (uint64_t)inc;
	dlock_lock_options lo = DLOCK_LOCK_OPTIONS_INIT;
	lo.ttl_ms = o->ttl_ms;
	lo.on_lost = on_lost;
	lo.payload = &w;
	int rc = open_store(c, slot, &store);
	if (rc == 0)
		rc = dlock_lock_new(&lock, store, o->name, &lo);
	if (rc != 0) {
		logf_line(c->log_fd, "E %d %d 0 %lld %d\n", slot, inc, (long long)check_now_us(), rc);
		dlock_store_close(store);
		check_sleep_ms(100); /* the parent replaces us: not in a tight loop */
		return CLI_EXIT_FAIL;
	}
	long long seq = 0;
	while (!atomic_load(&c->sh->stop)) {
		int64_t left_ms = (c->deadline_us - check_now_us()) / 1000;
		if (left_ms <= 0)
			break;
		if (atomic_exchange(&c->sh->reopen[slot], 0)) {
			/* After file-delete: open the store as a process started now would. */
			dlock_lock_free(lock);
			dlock_store_close(store);
			lock = NULL;
			store = NULL;
			rc = open_store(c, slot, &store);
			if (rc == 0)
				rc = dlock_lock_new(&lock, store, o->name, &lo);
			if (rc != 0) {
				logf_line(c->log_fd, "E %d %d %lld %lld %d\n", slot, inc, seq, (long long)check_now_us(), rc);
				dlock_store_close(store);
				return CLI_EXIT_FAIL; /* replaced by the parent */
			}
		}
		/* With file-delete, waiters look at the reopen flag every ttl/2. */
		int64_t wait_ms = left_ms;
		if ((o->faults & F_FDELETE) && wait_ms > o->ttl_ms / 2)
			wait_ms = o->ttl_ms / 2;
		seq++;
		atomic_store(&w.seq, seq);
		int64_t t_req = check_now_us();
		rc = dlock_acquire(lock, wait_ms);
		if (rc == DLOCK_ETIMEOUT && wait_ms < left_ms)
			continue;
		if (rc == DLOCK_ETIMEOUT)
			break;
		if (rc != 0) {
			/* The store is down (a restart fault): note it and try again. */
			logf_line(c->log_fd, "E %d %d %lld %lld %d\n", slot, inc, seq, (long long)check_now_us(), rc);
			check_sleep_ms(50);
			continue;
		}
		int64_t t_grant = check_now_us();
		uint64_t fence = dlock_fence(lock);
		logf_line(c->log_fd, "A %d %d %lld %lld %lld %" PRIu64 "\n", slot, inc, seq,
			  (long long)t_req, (long long)t_grant, fence);
		int64_t v = 0;
		uint64_t hb = 0;
		int ok = check_reg_access(c->reg_path, o->fencing, false, fence, &v, &hb);
		logf_line(c->log_fd, "W %d %d %lld %lld r %d %" PRIu64 " %lld %" PRIu64 "\n", slot, inc,
			  seq, (long long)check_now_us(), ok, fence, (long long)v, hb);
		/* Announced after the read: a pause then falls between read and write. */
		atomic_store(&c->sh->holding[slot], seq);
		/* The work; a SIGSTOP here is the GC pause: on waking, write at once. */
		check_sleep_until(t_grant + o->hold_ms * 1000);
		if (ok == 1) {
			int64_t nv = v + 1;
			ok = check_reg_access(c->reg_path, o->fencing, true, fence, &nv, &hb);
			logf_line(c->log_fd, "W %d %d %lld %lld w %d %" PRIu64 " %lld %" PRIu64 "\n", slot,
				  inc, seq, (long long)check_now_us(), ok, fence, (long long)nv, hb);
		}
		atomic_store(&c->sh->holding[slot], 0);
		/* Logged before the call: the work is done here, and a release that
		 * hangs (a black hole) must not make the hold look longer. */
		logf_line(c->log_fd, "R %d %d %lld %lld 0\n", slot, inc, seq, (long long)check_now_us());
		dlock_release(lock);
		/* A short think time, so that the releasing worker does not always win again. */
		check_sleep_ms((int64_t)check_rnd_below(&rs, (uint64_t)(o->hold_ms / 2 + 1)));
	}
	dlock_lock_free(lock);
	dlock_store_close(store);
	return 0;
}

pid_t check_spawn_worker(const run_ctx *c, int slot, int inc)
{
	atomic_store(&c->sh->holding[slot], 0); /* a killed predecessor may have left it set */
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		_exit(worker_main(c, slot, inc));
	}
	return pid;
}
