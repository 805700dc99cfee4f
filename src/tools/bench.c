/*
 * bench.c — `dlock bench`: how fast locks are on a store, next to the
 * store's own floor measured in the same run (the module bench/floor.c; bench.h).
 *
 * Workloads (docs/performance.md defines them; bench/peers/ runs the same
 * ones with other lock libraries):
 *   uncontended  each client loops acquire+release on its own name(s),
 *                alternating 100 ms slices with the floor so that load from
 *                elsewhere on the machine hits both alike;
 *   contended    every client loops acquire -> hold -> release -> think on
 *                one name; grants/s, fairness and the handoff gap;
 *   reentrant    re-acquire of a held lock (no round trip expected);
 *   renewal      --locks K held by one process for --duration: renewal CPU
 *                and (Redis) server reads and script calls (requests) per renewal tick.
 * Clients are processes (fork), each with its own store handle, so one
 * client's stalls cannot hide in another's; they log every grant with
 * CLOCK_MONOTONIC times into shared memory, and the parent does the sums.
 */
#include "bench.h"
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CLIENTS 4096 /* the 2,000-waiter runs of docs/performance.md */
#define SLICE_NS 100000000LL     /* uncontended: ours and the floor take turns */
#define ACQUIRE_WAIT_MS 30000    /* a contended grant slower than this is a failure */

static const char help[] =
	"Usage: dlock bench [--workload W] [--clients N] [--locks K] [--hold D]\n"
	"                   [--think D] [--duration D] [--ttl D] [--fair] [--no-baseline]\n"
	"\n"
	"Measure locks on the store (--store URI) and, in the same run, the store's\n"
	"own floor for the same round trips (e.g. Redis: 2 x PING), printing our\n"
	"figures as a ratio of it. Clients are separate processes, each with its own\n"
	"connection. With --json, one JSON object (see docs/performance.md).\n"
	"\n"
	"Workloads:\n"
	"  uncontended  acquire+release of the client's own name in a loop (default)\n"
	"  contended    all clients on one name: acquire, hold, release, think\n"
	"  reentrant    re-acquire of a lock this handle already holds\n"
	"  renewal      hold --locks K at once for --duration; renewal cost per tick\n"
	"\n"
	"  --workload W   one of the above\n"
	"  --clients N    client processes (default 1; contended: 8)\n"
	"  --locks K      names per client (default 1; renewal: 10000)\n"
	"  --hold D       hold each grant for D (default 0; contended: 1ms)\n"
	"  --think D      pause between release and the next acquire (contended: 1ms)\n"
	"  --duration D   measuring time (default 5s)\n"
	"  --ttl D        lease (default: the store's; renewal: 3s)\n"
	"  --fair         request fair (FIFO) locks\n"
	"  --no-baseline  skip the floor measurement\n"
	"\n%s"
	"\nExit codes: 0 done, 64 bad usage, 69 store unavailable, 1 a client failed.\n";

enum { O_WORKLOAD = 1, O_CLIENTS, O_LOCKS, O_HOLD, O_THINK, O_DURATION, O_TTL, O_FAIR, O_NOBASE };

static const cli_opt opts[] = {
	{ "workload", 'w', true, O_WORKLOAD },
	{ "clients", 'c', true, O_CLIENTS },
	{ "locks", 'k', true, O_LOCKS },
	{ "hold", 0, true, O_HOLD },
	{ "think", 0, true, O_THINK },
	{ "duration", 'd', true, O_DURATION },
	{ "ttl", 0, true, O_TTL },
	{ "fair", 0, false, O_FAIR },
	{ "no-baseline", 0, false, O_NOBASE },
	{ NULL, 0, false, 0 },
};

enum workload { W_UNCONTENDED, W_CONTENDED, W_REENTRANT, W_RENEWAL };
static const char *const workload_names[] = { "uncontended", "contended", "reentrant", "renewal" };

typedef struct config {
	cli_global *g;
	const char *uri;
	enum workload w;
	unsigned int clients, locks;
	int64_t hold_ms, think_ms, duration_ms, ttl_ms;
	bool clients_set, locks_set, hold_set, think_set, fair, baseline;
} config;

/* One grant, CLOCK_MONOTONIC ns: request, grant, release call, release done. */
typedef struct grant {
	int64_t req, got, rel0, rel1;
} grant;

/* One client's figures, in memory shared with the parent. */
typedef struct slot {
	int ready, failed;
	long long ops, floor_ops;       /* ops is read live by the progress bar */
	int64_t ours_ns, floor_ns;      /* time spent in each (uncontended) */
	int64_t ours_cpu, floor_cpu;    /* process CPU ns spent in each */
	long long ours_csw, floor_csw;  /* context switches of the process (every thread) in each */
	long long ours_cmds, floor_cmds; /* server commands in each (one client only; -1: unknown) */
	size_t ngrants;                 /* entries logged (<= the slot's capacity) */
	char err[256];
} slot;

typedef struct shared {
	int go;
	int64_t start, end;
	char floor_what[96];
	int floor_state;                /* 0 none tried, 1 measured, -1 unavailable */
	char floor_why[256];
	slot slots[MAX_CLIENTS];
} shared;

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The process's CPU ns so far, and (csw not NULL) its context switches,
 * voluntary and not, of all its threads. */
static int64_t usage(long long *csw)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	if (csw)
		*csw = ru.ru_nvcsw + ru.ru_nivcsw;
	return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000 +
	       ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
}

static int64_t cpu_ns(void)
{
	return usage(NULL);
}

/* Server commands between two readings (each reading is one INFO, counted
 * by the next), or -1 when either is unknown. */
static long long commands_between(long long a, long long b)
{
	return a >= 0 && b >= 0 ? b - a - 1 : -1;
}

/* Add one slice's count to a slot's (-1 sticks). */
static void add_count(long long *sum, long long n)
{
	*sum = *sum < 0 || n < 0 ? -1 : *sum + n;
}

static void sleep_until(int64_t t)
{
	struct timespec ts = { (time_t)(t / 1000000000), (long)(t % 1000000000) };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int on_opt(void *p, int id, const char *value)
{
	config *c = p;
	switch (id) {
	case O_WORKLOAD:
		for (int i = 0; i < 4; i++) {
			if (strcmp(value, workload_names[i]) == 0) {
				c->w = (enum workload)i;
				return 0;
			}
		}
		return cli_usage_error(c->g, "--workload: unknown '%s' (uncontended, contended, reentrant, renewal)",
				       value);
	case O_CLIENTS:
		c->clients_set = true;
		return cli_uint(c->g, "--clients", value, MAX_CLIENTS, &c->clients);
	case O_LOCKS:
		c->locks_set = true;
		return cli_uint(c->g, "--locks", value, 1000000, &c->locks);
	case O_HOLD:
		c->hold_set = true;
		return cli_duration(c->g, "--hold", value, &c->hold_ms);
	case O_THINK:
		c->think_set = true;
		return cli_duration(c->g, "--think", value, &c->think_ms);
	case O_DURATION:
		return cli_duration(c->g, "--duration", value, &c->duration_ms);
	case O_TTL:
		return cli_duration(c->g, "--ttl", value, &c->ttl_ms);
	case O_FAIR:
		c->fair = true;
		return 0;
	case O_NOBASE:
		c->baseline = false;
		return 0;
	}
	return 0;
}

/* --- the client processes ------------------------------------------------ */

typedef struct client {
	const config *cfg;
	shared *sh;
	slot *me;
	grant *log;
	size_t cap;
	int id;
} client;

static int client_fail(client *c, const char *what)
{
	snprintf(c->me->err, sizeof(c->me->err), "client %d: %s: %s", c->id, what, dlock_error_last()->message);
	__atomic_store_n(&c->me->failed, 1, __ATOMIC_RELEASE);
	return 1;
}

/* Read end of the start pipe: the parent closes its write end to start
 * everyone (EOF wakes every reader at once). Waiting by polling a flag every
 * millisecond kept 2,000 ready clients so busy that the rest never warmed up. */
static int go_fd = -1;

static int wait_go(client *c)
{
	__atomic_store_n(&c->me->ready, 1, __ATOMIC_RELEASE);
	char b;
	ssize_t n;
	while ((n = read(go_fd, &b, 1)) > 0 || (n < 0 && errno == EINTR))
		;
	/* EOF without the flag: the parent gave up (or died) before the start */
	return __atomic_load_n(&c->sh->go, __ATOMIC_ACQUIRE) ? 0 : -1;
}

/* One acquire [hold] release, logged. Returns 0 or a dlock error code. */
static int cycle(client *c, dlock_lock *l, int64_t wait_ms, int64_t hold_ns)
{
	grant gr;
	gr.req = now_ns();
	int rc = dlock_acquire(l, wait_ms);
	if (rc != 0)
		return rc;
	gr.got = now_ns();
	if (hold_ns > 0)
		sleep_until(gr.got + hold_ns);
	gr.rel0 = now_ns();
	rc = dlock_release(l);
	if (rc != 0)
		return rc;
	gr.rel1 = now_ns();
	if (c->me->ngrants < c->cap)
		c->log[c->me->ngrants++] = gr;
	__atomic_store_n(&c->me->ops, c->me->ops + 1, __ATOMIC_RELAXED);
	return 0;
}

static int run_client(client *c)
{
	const config *cfg = c->cfg;
	dlock_store *store = NULL;
	if (dlock_store_open(&store, cfg->uri) != 0)
		return client_fail(c, "open");
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.fair = cfg->fair;
	o.ttl_ms = cfg->ttl_ms;
	unsigned int nlocks = cfg->w == W_CONTENDED ? 1 : cfg->locks;
	dlock_lock **locks = calloc(nlocks, sizeof(*locks));
	if (!locks)
		return client_fail(c, "out of memory");
	for (unsigned int j = 0; j < nlocks; j++) {
		char name[96];
		if (cfg->w == W_CONTENDED)
			snprintf(name, sizeof(name), "dlock-bench/contended-%d", (int)getppid());
		else
			snprintf(name, sizeof(name), "dlock-bench/%d-%u", (int)getpid(), j);
		if (dlock_lock_new(&locks[j], store, name, &o) != 0)
			return client_fail(c, "lock");
	}
	/* Warm-up, not counted: connections, schema, scripts, JIT on the server. */
	bench_floor *floor = NULL;
	if (cfg->w == W_UNCONTENDED) {
		for (unsigned int j = 0; j < nlocks; j++)
			if (dlock_acquire(locks[j], ACQUIRE_WAIT_MS) != 0 || dlock_release(locks[j]) != 0)
				return client_fail(c, "warm-up");
		char why[256];
		if (cfg->baseline && bench_floor_open(&floor, cfg->uri, why, sizeof(why)) == 0 &&
		    bench_floor_step(floor, why, sizeof(why)) != 0) {
			snprintf(c->me->err, sizeof(c->me->err), "client %d: floor: %.200s", c->id, why);
			__atomic_store_n(&c->me->failed, 1, __ATOMIC_RELEASE);
			return 1;
		}
	}
	if (wait_go(c) != 0)
		return 1;
	int64_t hold = cfg->hold_ms * 1000000, think = cfg->think_ms * 1000000;
	long long csw0, csw1, csw2;
	int64_t end = c->sh->end, t = now_ns(), cpu0 = usage(&csw0);
	unsigned int j = 0;
	/* Server commands are counted only when one client is alone on the server. */
	bool count = floor && cfg->clients == 1;
	c->me->ours_cmds = c->me->floor_cmds = count ? 0 : -1;
	while (t < end) {
		if (cfg->w == W_CONTENDED) {
			int rc = cycle(c, locks[0], ACQUIRE_WAIT_MS, hold);
			if (rc != 0)
				return client_fail(c, "acquire/release");
			if (think > 0)
				sleep_until(now_ns() + think);
			t = now_ns();
			continue;
		}
		/* Uncontended: a slice of ours, then a slice of the floor. */
		long long k0 = -1;
		if (count) { /* before our slice's clock starts */
			k0 = bench_floor_server_commands(floor);
			t = now_ns();
		}
		int64_t slice_end = t + SLICE_NS, c0 = usage(&csw0);
		while (t < slice_end && t < end) {
			if (cycle(c, locks[j], ACQUIRE_WAIT_MS, hold) != 0)
				return client_fail(c, "acquire/release");
			j = (j + 1) % nlocks;
			t = now_ns();
		}
		int64_t t1 = now_ns(), c1 = usage(&csw1);
		c->me->ours_ns += t1 - (slice_end - SLICE_NS);
		c->me->ours_cpu += c1 - c0;
		c->me->ours_csw += csw1 - csw0;
		long long k1 = count ? bench_floor_server_commands(floor) : -1;
		if (count) { /* the reading is neither side's: the floor's slice starts after it */
			add_count(&c->me->ours_cmds, commands_between(k0, k1));
			t1 = now_ns();
			c1 = usage(&csw1);
		}
		if (!floor || t1 >= end) {
			t = t1;
			continue;
		}
		slice_end = t1 + SLICE_NS;
		t = t1;
		while (t < slice_end && t < end) {
			char why[256];
			if (bench_floor_step(floor, why, sizeof(why)) != 0) {
				snprintf(c->me->err, sizeof(c->me->err), "client %d: floor: %.200s", c->id, why);
				__atomic_store_n(&c->me->failed, 1, __ATOMIC_RELEASE);
				return 1;
			}
			c->me->floor_ops++;
			t = now_ns();
		}
		c->me->floor_ns += t - t1;
		c->me->floor_cpu += usage(&csw2) - c1;
		c->me->floor_csw += csw2 - csw1;
		if (count)
			add_count(&c->me->floor_cmds, commands_between(k1, bench_floor_server_commands(floor)));
	}
	if (cfg->w == W_CONTENDED) {
		c->me->ours_cpu = usage(&csw1) - cpu0;
		c->me->ours_csw = csw1 - csw0;
	}
	bench_floor_close(floor);
	for (unsigned int k = 0; k < nlocks; k++)
		dlock_lock_free(locks[k]);
	free(locks);
	dlock_store_close(store);
	return 0;
}

/* --- statistics ------------------------------------------------------------ */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

typedef struct tagged {
	grant g;
	int client;
} tagged;

static int cmp_got(const void *a, const void *b)
{
	const tagged *x = a, *y = b;
	return x->g.got < y->g.got ? -1 : x->g.got > y->g.got;
}

static double pct(const int64_t *v, size_t n, double p)
{
	if (n == 0)
		return 0;
	size_t i = (size_t)ceil(p * (double)n) - 1;
	return (double)v[i < n ? i : n - 1];
}

typedef struct result {
	double rate;                    /* pairs/s (uncontended) or grants/s */
	long long ops;
	double lat[4];                  /* acquire latency p50 p90 p99 max, us */
	double rlat[2];                 /* release latency p50 p99, us */
	double hold_mean;               /* measured got -> release call, ms (sleeps overshoot) */
	double share_min, share_max, jain;
	double cpu_per_k;               /* CPU s per 1000 ops, client side */
	double csw_per_op, cmds_per_op; /* context switches, server commands (-1: unknown) per op */
	/* contended */
	long long handoffs;             /* grants to another client that was waiting */
	double gap_mean, gap_p50, gap_p99, gap_max; /* ms */
	long long inversions;           /* consecutive grants out of request order (> 0.1 ms) */
	/* the floor */
	int floor_state;
	double floor_rate, floor_cpu_per_k, ideal;
	double floor_csw_per_op, floor_cmds_per_op;
	/* reentrant / renewal */
	double acquire_s, release_s, cpu_per_tick_ms, server_reads_per_tick, server_scripts_per_tick, ticks;
	long long lost;
} result;

static int summarize(const config *cfg, shared *sh, grant *logs, size_t cap, result *r)
{
	size_t n = 0;
	double sum = 0, sum2 = 0;
	r->share_min = INFINITY;
	int64_t cpu = 0;
	long long ops = 0, csw = 0, fops = 0, fcsw = 0;
	r->cmds_per_op = r->floor_cmds_per_op = -1;
	for (unsigned int i = 0; i < cfg->clients; i++) {
		slot *s = &sh->slots[i];
		n += s->ngrants;
		double x = (double)s->ops;
		sum += x;
		sum2 += x * x;
		r->share_min = fmin(r->share_min, x);
		r->share_max = fmax(r->share_max, x);
		cpu += s->ours_cpu;
		ops += s->ops;
		csw += s->ours_csw;
		fops += s->floor_ops;
		fcsw += s->floor_csw;
		if (cfg->clients == 1 && s->ours_cmds >= 0 && s->ops > 0)
			r->cmds_per_op = (double)s->ours_cmds / (double)s->ops;
		if (cfg->clients == 1 && s->floor_cmds >= 0 && s->floor_ops > 0)
			r->floor_cmds_per_op = (double)s->floor_cmds / (double)s->floor_ops;
		if (cfg->w == W_UNCONTENDED && s->ours_ns > 0)
			r->rate += (double)s->ops * 1e9 / (double)s->ours_ns;
		if (s->floor_ns > 0) {
			r->floor_rate += (double)s->floor_ops * 1e9 / (double)s->floor_ns;
			r->floor_cpu_per_k += (double)s->floor_cpu / 1e9 / (double)s->floor_ops * 1000 / cfg->clients;
		}
	}
	r->ops = ops;
	r->jain = sum2 > 0 ? sum * sum / (cfg->clients * sum2) : 0;
	r->cpu_per_k = ops ? (double)cpu / 1e9 / (double)ops * 1000 : 0;
	r->csw_per_op = ops ? (double)csw / (double)ops : 0;
	r->floor_csw_per_op = fops ? (double)fcsw / (double)fops : 0;
	tagged *all = calloc(n ? n : 1, sizeof(*all));
	int64_t *lat = calloc(n ? n : 1, sizeof(*lat));
	int64_t *gaps = calloc(n ? n : 1, sizeof(*gaps));
	int64_t *rel = calloc(n ? n : 1, sizeof(*rel));
	if (!all || !lat || !gaps || !rel) {
		free(all);
		free(lat);
		free(gaps);
		free(rel);
		return DLOCK_ENOMEM;
	}
	size_t k = 0;
	for (unsigned int i = 0; i < cfg->clients; i++)
		for (size_t e = 0; e < sh->slots[i].ngrants; e++)
			all[k++] = (tagged){ logs[i * cap + e], (int)i };
	qsort(all, n, sizeof(*all), cmp_got);
	size_t ngaps = 0;
	double gsum = 0;
	for (size_t i = 0; i < n; i++) {
		lat[i] = all[i].g.got - all[i].g.req;
		rel[i] = all[i].g.rel1 - all[i].g.rel0;
		r->hold_mean += (double)(all[i].g.rel0 - all[i].g.got) / 1e6 / (double)n;
		if (i == 0)
			continue;
		const tagged *p = &all[i - 1], *q = &all[i];
		/* A handoff: the lock went to another client that was already
		 * waiting when the holder began to release it. The gap runs from
		 * that release call to the new holder's acquire returning. */
		if (q->client != p->client && q->g.req < p->g.rel0) {
			gaps[ngaps++] = q->g.got - p->g.rel0;
			gsum += (double)(q->g.got - p->g.rel0);
		}
		if (q->g.req + 100000 < p->g.req)
			r->inversions++;
	}
	if (cfg->w == W_CONTENDED) {
		/* Grants inside the window; a grant after the end is not counted. */
		long long in = 0;
		for (size_t i = 0; i < n; i++)
			in += all[i].g.got <= sh->end;
		r->rate = (double)in * 1e9 / (double)(sh->end - sh->start);
	}
	qsort(lat, n, sizeof(*lat), cmp_i64);
	double q[4] = { 0.5, 0.9, 0.99, 1.0 };
	for (int i = 0; i < 4; i++)
		r->lat[i] = pct(lat, n, q[i]) / 1e3;
	qsort(rel, n, sizeof(*rel), cmp_i64);
	r->rlat[0] = pct(rel, n, 0.5) / 1e3;
	r->rlat[1] = pct(rel, n, 0.99) / 1e3;
	qsort(gaps, ngaps, sizeof(*gaps), cmp_i64);
	r->handoffs = (long long)ngaps;
	r->gap_mean = ngaps ? gsum / (double)ngaps / 1e6 : 0;
	r->gap_p50 = pct(gaps, ngaps, 0.5) / 1e6;
	r->gap_p99 = pct(gaps, ngaps, 0.99) / 1e6;
	r->gap_max = pct(gaps, ngaps, 1.0) / 1e6;
	free(all);
	free(lat);
	free(gaps);
	free(rel);
	return 0;
}

/* --- output ------------------------------------------------------------------ */

/* The URI with every secret masked, for output: the core's one masking
 * function (dlock_uri_redact), as everywhere else. */
static void safe_uri(char *buf, size_t len, const char *uri)
{
	char *r = dlock_uri_redact(uri);
	snprintf(buf, len, "%s", r ? r : "(unprintable)");
	dlock_free(r);
}

static void print_json(const config *cfg, const char *kind, const result *r, const shared *sh)
{
	char u[1024];
	double load[3] = { 0, 0, 0 };
	getloadavg(load, 3);
	safe_uri(u, sizeof(u), cfg->uri);
	printf("{\"store\":");
	cli_json_str(stdout, kind);
	printf(",\"uri\":");
	cli_json_str(stdout, u);
	printf(",\"workload\":\"%s\",\"clients\":%u,\"locks\":%u,\"fair\":%s,\"hold_ms\":%lld,"
	       "\"think_ms\":%lld,\"duration_s\":%.3f,\"load\":[%.2f,%.2f,%.2f],\"ops\":%lld,"
	       "\"rate\":%.1f,\"cpu_s_per_1000\":%.5f",
	       workload_names[cfg->w], cfg->clients, cfg->locks, cfg->fair ? "true" : "false", (long long)cfg->hold_ms,
	       (long long)cfg->think_ms, (double)cfg->duration_ms / 1e3, load[0], load[1], load[2], r->ops, r->rate,
	       r->cpu_per_k);
	if (cfg->w == W_UNCONTENDED || cfg->w == W_CONTENDED) {
		printf(",\"context_switches_per_op\":%.3f", r->csw_per_op);
		if (r->cmds_per_op >= 0)
			printf(",\"server_commands_per_op\":%.3f", r->cmds_per_op);
		printf(",\"latency_us\":{\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,\"max\":%.1f}", r->lat[0], r->lat[1],
		       r->lat[2], r->lat[3]);
		printf(",\"release_latency_us\":{\"p50\":%.1f,\"p99\":%.1f}", r->rlat[0], r->rlat[1]);
		printf(",\"share\":{\"min\":%.0f,\"max\":%.0f,\"jain\":%.4f}", r->share_min, r->share_max, r->jain);
	}
	if (cfg->w == W_CONTENDED)
		printf(",\"handoff\":{\"count\":%lld,\"fraction\":%.4f,\"gap_mean_ms\":%.3f,"
		       "\"gap_p50_ms\":%.3f,\"gap_p99_ms\":%.3f,\"gap_max_ms\":%.3f},\"order_inversions\":%lld,"
		       "\"hold_mean_ms\":%.3f",
		       r->handoffs, r->ops ? (double)r->handoffs / (double)r->ops : 0, r->gap_mean, r->gap_p50,
		       r->gap_p99, r->gap_max, r->inversions, r->hold_mean);
	if (cfg->w == W_RENEWAL)
		printf(",\"acquire_all_s\":%.3f,\"release_all_s\":%.3f,\"ticks\":%.1f,\"cpu_ms_per_tick\":%.3f,"
		       "\"server_reads_per_tick\":%.1f,\"script_calls_per_tick\":%.2f,\"lost\":%lld",
		       r->acquire_s, r->release_s, r->ticks, r->cpu_per_tick_ms, r->server_reads_per_tick,
		       r->server_scripts_per_tick, r->lost);
	printf(",\"baseline\":");
	if (r->floor_state == 1) {
		printf("{\"what\":");
		cli_json_str(stdout, sh->floor_what);
		printf(",\"rate\":%.1f,\"cpu_s_per_1000\":%.5f", r->floor_rate, r->floor_cpu_per_k);
		if (cfg->w == W_UNCONTENDED) {
			printf(",\"context_switches_per_op\":%.3f", r->floor_csw_per_op);
			if (r->floor_cmds_per_op >= 0)
				printf(",\"server_commands_per_op\":%.3f", r->floor_cmds_per_op);
		}
		if (cfg->w == W_CONTENDED)
			printf(",\"ideal_grants\":%.1f,\"ratio\":%.4f}", r->ideal,
			       r->ideal > 0 ? r->rate / r->ideal : 0);
		else
			printf(",\"ratio\":%.4f}", r->floor_rate > 0 ? r->rate / r->floor_rate : 0);
	} else if (r->floor_state == -1) {
		printf("{\"what\":null,\"why\":");
		cli_json_str(stdout, sh->floor_why);
		printf("}");
	} else {
		printf("null");
	}
	printf("}\n");
}

static void print_table(const config *cfg, const char *kind, const result *r, const shared *sh)
{
	char u[1024], d[32];
	double load[3] = { 0, 0, 0 };
	getloadavg(load, 3);
	safe_uri(u, sizeof(u), cfg->uri);
	printf("dlock bench: %s (%s), %s, %u client%s%s, %s; load %.2f %.2f %.2f\n", u, kind, workload_names[cfg->w],
	       cfg->clients, cfg->clients == 1 ? "" : "s", cfg->fair ? ", fair" : "",
	       cli_fmt_duration(d, sizeof(d), cfg->duration_ms), load[0], load[1], load[2]);
	const char *unit = cfg->w == W_CONTENDED ? "grants/s" : cfg->w == W_REENTRANT ? "re-acquires/s" : "pairs/s";
	if (cfg->w == W_RENEWAL) {
		printf("  %-28s %u in %.2f s (%.0f/s), released in %.2f s\n", "locks acquired", cfg->locks,
		       r->acquire_s, r->acquire_s > 0 ? cfg->locks / r->acquire_s : 0, r->release_s);
		printf("  %-28s %.1f\n", "renewal ticks (ttl/3)", r->ticks);
		printf("  %-28s %.2f ms\n", "CPU per tick", r->cpu_per_tick_ms);
		if (r->server_reads_per_tick >= 0)
			printf("  %-28s %.1f\n", "server reads per tick", r->server_reads_per_tick);
		if (r->server_scripts_per_tick >= 0)
			printf("  %-28s %.2f\n", "script calls per tick", r->server_scripts_per_tick);
		printf("  %-28s %lld\n", "locks lost", r->lost);
		return;
	}
	printf("  %-28s %.0f\n", unit, r->rate);
	if (r->floor_state == 1 && cfg->w == W_UNCONTENDED)
		printf("  %-28s %.0f  (%s)  ratio %.2f\n", "floor, iterations/s", r->floor_rate, sh->floor_what,
		       r->floor_rate > 0 ? r->rate / r->floor_rate : 0);
	else if (r->floor_state == 1 && cfg->w == W_CONTENDED)
		printf("  %-28s %.0f  (1 / (hold + one floor iteration: %s))  ratio %.2f\n", "ideal grants/s", r->ideal,
		       sh->floor_what, r->ideal > 0 ? r->rate / r->ideal : 0);
	else if (r->floor_state == -1)
		printf("  %-28s none: %s\n", "floor", sh->floor_why);
	if (cfg->w != W_REENTRANT) {
		printf("  %-28s p50 %.0f  p90 %.0f  p99 %.0f  max %.0f\n", "acquire latency, us", r->lat[0], r->lat[1],
		       r->lat[2], r->lat[3]);
		printf("  %-28s p50 %.0f  p99 %.0f\n", "release latency, us", r->rlat[0], r->rlat[1]);
		printf("  %-28s min %.0f  max %.0f  Jain %.3f\n", "per-client grants", r->share_min, r->share_max,
		       r->jain);
	}
	if (cfg->w == W_CONTENDED) {
		printf("  %-28s %lld of %lld grants (%.0f%%)\n", "handoffs to a waiter", r->handoffs, r->ops,
		       r->ops ? 100.0 * (double)r->handoffs / (double)r->ops : 0);
		printf("  %-28s mean %.3f  p50 %.3f  p99 %.3f  max %.3f\n", "handoff gap, ms", r->gap_mean, r->gap_p50,
		       r->gap_p99, r->gap_max);
		printf("  %-28s %lld\n", "grants out of request order", r->inversions);
		printf("  %-28s %.3f (asked: %lld)\n", "hold as measured, ms", r->hold_mean, (long long)cfg->hold_ms);
	}
	bool fl = r->floor_state == 1 && cfg->w == W_UNCONTENDED;
	printf("  %-28s %.4f", "CPU s per 1000 ops", r->cpu_per_k);
	if (fl)
		printf("  (floor %.4f)", r->floor_cpu_per_k);
	printf("\n");
	if (cfg->w == W_UNCONTENDED || cfg->w == W_CONTENDED) {
		printf("  %-28s %.2f", "context switches per op", r->csw_per_op);
		if (fl)
			printf("  (floor %.2f)", r->floor_csw_per_op);
		printf("\n");
	}
	if (r->cmds_per_op >= 0) {
		printf("  %-28s %.2f", "server commands per op", r->cmds_per_op);
		if (fl && r->floor_cmds_per_op >= 0)
			printf("  (floor %.2f)", r->floor_cmds_per_op);
		printf("\n");
	}
}

static void progress(const config *cfg, shared *sh, bool tty)
{
	if (!tty)
		return;
	int64_t now = now_ns(), total = sh->end - sh->start;
	double f = now <= sh->start ? 0 : fmin(1.0, (double)(now - sh->start) / (double)total);
	long long ops = 0;
	for (unsigned int i = 0; i < cfg->clients; i++)
		ops += __atomic_load_n(&sh->slots[i].ops, __ATOMIC_RELAXED);
	char bar[31];
	int fill = (int)(f * 30);
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = '\0';
	fprintf(stderr, "\r[%s] %3.0f%%  %lld ops ", bar, f * 100, ops);
	fflush(stderr);
}

/* --- the workloads ------------------------------------------------------ */

static int fork_clients(const config *cfg, shared *sh, grant *logs, size_t cap, pid_t *pids, int *go_write)
{
	int go[2];
	if (pipe(go) != 0) {
		cli_error(cfg->g, "pipe: %s", strerror(errno));
		return -1;
	}
	go_fd = go[0];
	*go_write = go[1];
	for (unsigned int i = 0; i < cfg->clients; i++) {
		fflush(NULL);
		pids[i] = fork();
		if (pids[i] < 0) {
			cli_error(cfg->g, "fork: %s", strerror(errno));
			return -1;
		}
		if (pids[i] == 0) {
			close(go[1]);
			client c = { cfg, sh, &sh->slots[i], logs + (size_t)i * cap, cap, (int)i };
			_exit(run_client(&c));
		}
	}
	return 0;
}

/* Wait for every child; 0 if all exited 0. Shows progress meanwhile. */
static int reap(const config *cfg, shared *sh, pid_t *pids, bool tty)
{
	unsigned int left = cfg->clients;
	int bad = 0;
	while (left > 0) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p > 0) {
			left--;
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
				bad = 1;
				/* One client is gone: the others would wait on the barrier forever. */
				for (unsigned int i = 0; i < cfg->clients; i++)
					if (pids[i] != p)
						kill(pids[i], SIGTERM);
			}
			continue;
		}
		if (p < 0 && errno != EINTR)
			break;
		if (__atomic_load_n(&sh->go, __ATOMIC_ACQUIRE))
			progress(cfg, sh, tty);
		usleep(100000);
	}
	return bad;
}

static int run_processes(const config *cfg, shared *sh, grant *logs, size_t cap, bool tty)
{
	pid_t pids[MAX_CLIENTS];
	int go_write = -1;
	if (fork_clients(cfg, sh, logs, cap, pids, &go_write) != 0)
		return CLI_EXIT_FAIL;
	/* Start everyone at once, after every client has connected and warmed up. */
	for (;;) {
		unsigned int ready = 0, failed = 0;
		for (unsigned int i = 0; i < cfg->clients; i++) {
			ready += __atomic_load_n(&sh->slots[i].ready, __ATOMIC_ACQUIRE);
			failed += __atomic_load_n(&sh->slots[i].failed, __ATOMIC_ACQUIRE);
		}
		if (failed || ready == cfg->clients)
			break;
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p > 0) /* died before it was ready */
			break;
		usleep(2000);
	}
	sh->start = now_ns() + 20000000;
	sh->end = sh->start + cfg->duration_ms * 1000000;
	__atomic_store_n(&sh->go, 1, __ATOMIC_RELEASE);
	close(go_write);
	close(go_fd);
	go_fd = -1;
	int bad = reap(cfg, sh, pids, tty);
	if (tty)
		fprintf(stderr, "\r%50s\r", "");
	for (unsigned int i = 0; i < cfg->clients; i++) {
		if (sh->slots[i].failed) {
			cli_error(cfg->g, "%s", sh->slots[i].err);
			return CLI_EXIT_FAIL;
		}
	}
	if (bad) {
		cli_error(cfg->g, "a client process failed");
		return CLI_EXIT_FAIL;
	}
	return 0;
}

/* The floor on its own for `ms`, in this process: iterations/s, or <0. */
static double floor_alone(const config *cfg, shared *sh, int64_t ms, double *cpu_per_k)
{
	bench_floor *f = NULL;
	if (bench_floor_open(&f, cfg->uri, sh->floor_why, sizeof(sh->floor_why)) != 0)
		return -1;
	snprintf(sh->floor_what, sizeof(sh->floor_what), "%s", bench_floor_what(f));
	long long n = 0;
	if (bench_floor_step(f, sh->floor_why, sizeof(sh->floor_why)) != 0) {
		bench_floor_close(f);
		return -1;
	}
	int64_t t0 = now_ns(), c0 = cpu_ns(), end = t0 + ms * 1000000, t = t0;
	while (t < end) {
		if (bench_floor_step(f, sh->floor_why, sizeof(sh->floor_why)) != 0) {
			bench_floor_close(f);
			return -1;
		}
		n++;
		t = now_ns();
	}
	*cpu_per_k = (double)(cpu_ns() - c0) / 1e9 / (double)n * 1000;
	bench_floor_close(f);
	return (double)n * 1e9 / (double)(t - t0);
}

static int run_reentrant(const config *cfg, dlock_store *store, result *r)
{
	dlock_lock *l = NULL;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = cfg->ttl_ms;
	char name[64];
	snprintf(name, sizeof(name), "dlock-bench/reentrant-%d", (int)getpid());
	int rc = dlock_lock_new(&l, store, name, &o);
	if (rc == 0)
		rc = dlock_acquire(l, ACQUIRE_WAIT_MS);
	if (rc != 0) {
		rc = cli_fail(cfg->g, rc, "acquire");
		dlock_lock_free(l);
		return rc;
	}
	/* Timestamps per batch: a clock read per op would cost as much as the op. */
	int64_t t0 = now_ns(), c0 = cpu_ns(), end = t0 + cfg->duration_ms * 1000000, t = t0;
	long long n = 0;
	while (t < end && rc == 0) {
		for (int i = 0; i < 4096 && rc == 0; i++)
			if ((rc = dlock_acquire(l, 0)) == 0)
				rc = dlock_release(l);
		n += 4096;
		t = now_ns();
	}
	if (rc != 0) {
		rc = cli_fail(cfg->g, rc, "re-acquire");
		dlock_lock_free(l);
		return rc;
	}
	r->ops = n;
	r->rate = (double)n * 1e9 / (double)(t - t0);
	r->cpu_per_k = (double)(cpu_ns() - c0) / 1e9 / (double)n * 1000;
	r->share_min = r->share_max = (double)n;
	r->jain = 1;
	rc = dlock_release(l);
	dlock_lock_free(l);
	return rc ? cli_fail(cfg->g, rc, "release") : 0;
}

static int run_renewal(const config *cfg, dlock_store *store, shared *sh, result *r, bool tty)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = cfg->ttl_ms;
	dlock_lock **locks = calloc(cfg->locks, sizeof(*locks));
	if (!locks) {
		cli_error(cfg->g, "out of memory");
		return CLI_EXIT_FAIL;
	}
	int rc = 0, ex = 0;
	unsigned int got = 0;
	int64_t t0 = now_ns();
	for (; got < cfg->locks; got++) {
		char name[96];
		snprintf(name, sizeof(name), "dlock-bench/renew-%d-%u", (int)getpid(), got);
		if ((rc = dlock_lock_new(&locks[got], store, name, &o)) != 0 ||
		    (rc = dlock_acquire(locks[got], ACQUIRE_WAIT_MS)) != 0) {
			ex = cli_fail(cfg->g, rc, "acquire");
			dlock_lock_free(locks[got]);
			locks[got] = NULL;
			goto out;
		}
	}
	r->acquire_s = (double)(now_ns() - t0) / 1e9;
	bench_floor *f = NULL;
	if (bench_floor_open(&f, cfg->uri, sh->floor_why, sizeof(sh->floor_why)) != 0)
		f = NULL;
	long long ops0 = bench_floor_server_ops(f), sc0 = bench_floor_server_scripts(f);
	sh->start = now_ns();
	sh->end = sh->start + cfg->duration_ms * 1000000;
	int64_t c0 = cpu_ns();
	while (now_ns() < sh->end) {
		progress(cfg, sh, tty);
		int64_t next = now_ns() + 200000000;
		sleep_until(next < sh->end ? next : sh->end);
	}
	int64_t cpu = cpu_ns() - c0;
	long long ops1 = bench_floor_server_ops(f), sc1 = bench_floor_server_scripts(f);
	bench_floor_close(f);
	if (tty)
		fprintf(stderr, "\r%50s\r", "");
	for (unsigned int i = 0; i < got; i++)
		r->lost += !dlock_held(locks[i]);
	/* The core renews every ttl/3 (src/core/renewer.c). */
	r->ticks = (double)cfg->duration_ms / ((double)cfg->ttl_ms / 3);
	r->cpu_per_tick_ms = r->ticks > 0 ? (double)cpu / 1e6 / r->ticks : 0;
	/* One INFO request sits between the two readings. */
	r->server_reads_per_tick = ops0 >= 0 && ops1 >= 0 && r->ticks > 0 ? (double)(ops1 - ops0 - 1) / r->ticks : -1;
	r->server_scripts_per_tick = sc0 >= 0 && sc1 >= 0 && r->ticks > 0 ? (double)(sc1 - sc0) / r->ticks : -1;
	r->ops = got;
out:;
	int64_t t1 = now_ns();
	for (unsigned int i = 0; i < got; i++) {
		if (dlock_held(locks[i]) && (rc = dlock_release(locks[i])) != 0 && ex == 0)
			ex = cli_fail(cfg->g, rc, "release");
		dlock_lock_free(locks[i]);
	}
	r->release_s = (double)(now_ns() - t1) / 1e9;
	free(locks);
	return ex;
}

int cli_bench(cli_global *g, int argc, char **argv)
{
	config cfg = { .g = g, .w = W_UNCONTENDED, .clients = 1, .locks = 1, .duration_ms = 5000, .baseline = true };
	cli_args a;
	int rc = cli_parse(g, argc, argv, opts, on_opt, &cfg, &a);
	if (rc == 0 && a.help) {
		printf(help, cli_global_help);
		free(a.pos);
		return 0;
	}
	if (rc == 0 && (a.npos > 0 || a.dashdash))
		rc = cli_usage_error(g, "unexpected argument '%s'", a.npos ? a.pos[0] : "--");
	free(a.pos);
	if (rc != 0)
		return rc;
	if (cfg.duration_ms <= 0)
		return cli_usage_error(g, "--duration must be more than 0");
	if (!cfg.clients_set)
		cfg.clients = cfg.w == W_CONTENDED ? 8 : 1;
	if (!cfg.hold_set)
		cfg.hold_ms = cfg.w == W_CONTENDED ? 1 : 0;
	if (!cfg.think_set)
		cfg.think_ms = cfg.w == W_CONTENDED ? 1 : 0;
	if (cfg.w == W_RENEWAL) {
		if (!cfg.locks_set)
			cfg.locks = 10000;
		if (cfg.ttl_ms == 0)
			cfg.ttl_ms = 3000;
	}
	if ((cfg.w == W_REENTRANT || cfg.w == W_RENEWAL) && cfg.clients != 1)
		return cli_usage_error(g, "--workload %s runs in one process (no --clients)", workload_names[cfg.w]);
	if (cfg.w == W_CONTENDED && cfg.locks_set && cfg.locks != 1)
		return cli_usage_error(g, "--workload contended uses one name (no --locks)");
	cfg.uri = cli_store_choice(g);
	char *def = NULL;
	if (!cfg.uri) {
		if (dlock_default_uri(&def) != 0)
			return cli_fail(g, DLOCK_EINVAL, "no default store");
		cfg.uri = def;
	}
	bool tty = isatty(STDERR_FILENO) && !g->json && g->verbosity >= 0;

	/* Fail early and clearly when the store cannot be reached at all. */
	dlock_store *store = NULL;
	if ((rc = cli_store_open(g, &store)) != 0) {
		dlock_free(def);
		return rc;
	}
	char kind[32];
	snprintf(kind, sizeof(kind), "%s", dlock_store_kind(store));

	shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	grant *logs = MAP_FAILED;
	size_t cap = 0;
	result r;
	memset(&r, 0, sizeof(r));
	if (sh == MAP_FAILED) {
		rc = cli_fail(g, DLOCK_ENOMEM, "mmap");
		goto out;
	}
	memset(sh, 0, sizeof(*sh));
	if (cfg.w == W_REENTRANT) {
		rc = run_reentrant(&cfg, store, &r);
		goto report;
	}
	if (cfg.w == W_RENEWAL) {
		rc = run_renewal(&cfg, store, sh, &r, tty);
		goto report;
	}
	/* Forked clients must not share this process's connections or threads. */
	dlock_store_close(store);
	store = NULL;
	/* Room for every grant a client could log: generous, and untouched pages cost nothing. */
	cap = (size_t)(cfg.duration_ms / 1000 + 1) * (cfg.w == W_CONTENDED ? 5000 : 100000);
	logs = mmap(NULL, cap * cfg.clients * sizeof(grant), PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (logs == MAP_FAILED) {
		rc = cli_fail(g, DLOCK_ENOMEM, "mmap");
		goto out;
	}
	if (cfg.w == W_UNCONTENDED && cfg.baseline) {
		/* Which floor (or why none): the clients open their own. */
		bench_floor *f = NULL;
		if (bench_floor_open(&f, cfg.uri, sh->floor_why, sizeof(sh->floor_why)) == 0) {
			snprintf(sh->floor_what, sizeof(sh->floor_what), "%s", bench_floor_what(f));
			bench_floor_close(f);
			r.floor_state = 1;
		} else {
			r.floor_state = -1;
		}
		cfg.baseline = r.floor_state == 1;
	}
	if ((rc = run_processes(&cfg, sh, logs, cap, tty)) != 0)
		goto out;
	if (summarize(&cfg, sh, logs, cap, &r) != 0) {
		rc = cli_fail(g, DLOCK_ENOMEM, "statistics");
		goto out;
	}
	if (cfg.w == W_CONTENDED && cfg.baseline) {
		/* The ideal: one hold plus the round trips of one handoff, back to back. */
		int64_t ms = cfg.duration_ms / 5 < 1000 ? (cfg.duration_ms / 5 > 200 ? cfg.duration_ms / 5 : 200)
							: 1000;
		double fr = floor_alone(&cfg, sh, ms, &r.floor_cpu_per_k);
		r.floor_state = fr > 0 ? 1 : -1;
		if (fr > 0) {
			r.floor_rate = fr;
			r.ideal = 1.0 / ((double)cfg.hold_ms / 1e3 + 1.0 / fr);
		}
	}
report:
	if (rc == 0) {
		if (g->json)
			print_json(&cfg, kind, &r, sh);
		else
			print_table(&cfg, kind, &r, sh);
		if (fflush(stdout) != 0)
			rc = CLI_EXIT_FAIL;
	}
out:
	if (logs != MAP_FAILED)
		munmap(logs, cap * cfg.clients * sizeof(grant));
	if (sh != MAP_FAILED)
		munmap(sh, sizeof(*sh));
	dlock_store_close(store);
	dlock_free(def);
	return rc;
}
