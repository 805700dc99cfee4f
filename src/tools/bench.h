/*
 * bench.h — `dlock bench` and its floors: the functions bench.c calls
 * (bench_floor.c), and the module that measures the floors (bench/floor.c,
 * built as dlock-floor.so with each store's client library; the tool loads it
 * when a bench needs a floor, and links no store client library itself).
 *
 * A "floor" is the store's own cost for the round trips one acquire+release
 * needs, done with the store's client library directly on the same kind of
 * connection the store uses (docs/performance.md lists them). `dlock bench`
 * interleaves it with the lock loop in the same processes, so machine load
 * hits both alike and the ratio is meaningful on a busy machine.
 */
#ifndef DLOCK_CLI_BENCH_H
#define DLOCK_CLI_BENCH_H

#include <stddef.h>

typedef struct bench_floor bench_floor;

/*
 * Connect to the server behind `uri` (a dlock store URI) with its client
 * library. Returns 0 with *out set; 1 when this store has no floor in this
 * build (err says why: no client library compiled in, or a kind without
 * one); -1 on a failure (err says what). Not thread-safe; one per process.
 */
int bench_floor_open(bench_floor **out, const char *uri, char *err, size_t errlen);

/* What one step does, e.g. "2 x PING (hiredis)". Static text. */
const char *bench_floor_what(const bench_floor *f);

/* One step: the round trips of one acquire+release. 0, or -1 (err filled). */
int bench_floor_step(bench_floor *f, char *err, size_t errlen);

/*
 * The server's count of request reads so far (Redis: INFO
 * total_reads_processed, about one per round trip), or -1 when the store
 * has no such counter.
 * Used by the renewal workload to count round trips per tick.
 */
long long bench_floor_server_ops(bench_floor *f);

/* Script calls (Redis: EVALSHA + EVAL in INFO commandstats) so far, or -1:
 * each is one request the client waited for, i.e. one round trip. */
long long bench_floor_server_scripts(bench_floor *f);

/* Commands clients sent the server so far (Redis: INFO commandstats, the
 * calls of the commands a client sends: scripts, pub/sub, PING, connection
 * set-up, INFO — not the calls a script makes inside), or -1. This reading
 * is one INFO: it counts in the next reading. */
long long bench_floor_server_commands(bench_floor *f);

/* Close the connection and free f (NULL is fine). */
void bench_floor_close(bench_floor *f);

/*
 * The floor module: one exported object, BENCH_FLOOR_SYMBOL, whose functions
 * are the ones above (same contracts; open never answers 1 for "no module").
 * The tool looks for it in $DLOCK_FLOOR_MODULE, next to its own executable,
 * then where `make install` puts it; without it, benches run with no floor.
 */
#define BENCH_FLOOR_VERSION 2
#define BENCH_FLOOR_SYMBOL "dlock_bench_floor_module"
#define BENCH_FLOOR_FILE "dlock-floor.so"
typedef struct bench_floor_module {
	int version; /* BENCH_FLOOR_VERSION */
	int (*open)(bench_floor **out, const char *uri, char *err, size_t errlen);
	const char *(*what)(const bench_floor *f);
	int (*step)(bench_floor *f, char *err, size_t errlen);
	long long (*server_ops)(bench_floor *f);
	long long (*server_scripts)(bench_floor *f);
	void (*close)(bench_floor *f);
	long long (*server_commands)(bench_floor *f); /* version 2 */
} bench_floor_module;
extern const bench_floor_module dlock_bench_floor_module;

#endif
