/*
 * lockbench — acquire+release throughput of a store, and the store's own
 * floor for the same round trips measured in the same run.
 *
 *   lockbench URI [uncontended|contended] [CLIENTS] [SECONDS]
 *
 * uncontended: each client process loops acquire/release on its own name.
 * contended:   every client loops acquire/release on one name (handoffs/s).
 * For sqlite: URIs the baseline is BEGIN IMMEDIATE/COMMIT pairs on the same
 * file, from the same number of processes.
 */
#define _GNU_SOURCE
#include <dlock/dlock.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_SQLITE
#include <sqlite3.h>
#endif

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long *counts; /* shared between processes */

static int client(const char *uri, int id, int contended, double seconds)
{
	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0) {
		fprintf(stderr, "open: %s\n", dlock_error_last()->message);
		return 1;
	}
	char name[64];
	snprintf(name, sizeof(name), contended ? "bench/contended" : "bench/own-%d", id);
	dlock_lock *l;
	if (dlock_lock_new(&l, s, name, NULL) != 0)
		return 1;
	double end = now_s() + seconds;
	long n = 0;
	while (now_s() < end) {
		if (dlock_acquire(l, contended ? 10000 : 0) != 0) {
			fprintf(stderr, "acquire: %s\n", dlock_error_last()->message);
			return 1;
		}
		if (dlock_release(l) != 0) {
			fprintf(stderr, "release: %s\n", dlock_error_last()->message);
			return 1;
		}
		n++;
	}
	counts[id] = n;
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

#ifdef HAVE_SQLITE
static int baseline_client(const char *file, int id, double seconds)
{
	sqlite3 *db;
	if (sqlite3_open(file, &db) != SQLITE_OK)
		return 1;
	sqlite3_busy_timeout(db, 10000);
	sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", 0, 0, 0);
	double end = now_s() + seconds;
	long n = 0;
	while (now_s() < end) {
		if (sqlite3_exec(db, "BEGIN IMMEDIATE", 0, 0, 0) != SQLITE_OK ||
		    sqlite3_exec(db, "COMMIT", 0, 0, 0) != SQLITE_OK)
			return 1;
		n++;
	}
	counts[id] = n;
	sqlite3_close(db);
	return 0;
}
#endif

static double run(int clients, double seconds, int (*fn)(const char *, int, int, double),
		  const char *uri, int contended)
{
	memset(counts, 0, sizeof(long) * (size_t)clients);
	pid_t pids[256];
	for (int i = 0; i < clients; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(fn(uri, i, contended, seconds));
	}
	long total = 0;
	int bad = 0;
	for (int i = 0; i < clients; i++) {
		int st;
		waitpid(pids[i], &st, 0);
		bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
		total += counts[i];
	}
	if (bad) {
		fprintf(stderr, "a client failed\n");
		exit(1);
	}
	return (double)total / seconds;
}

#ifdef HAVE_SQLITE
static int baseline_adapter(const char *file, int id, int contended, double seconds)
{
	(void)contended;
	return baseline_client(file, id, seconds);
}
#endif

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: lockbench URI [uncontended|contended] [CLIENTS] [SECONDS]\n");
		return 64;
	}
	const char *uri = argv[1];
	int contended = argc > 2 && strcmp(argv[2], "contended") == 0;
	int clients = argc > 3 ? atoi(argv[3]) : (contended ? 8 : 1);
	double seconds = argc > 4 ? atof(argv[4]) : 5;
	if (clients < 1 || clients > 256 || seconds <= 0)
		return 64;
	counts = mmap(NULL, sizeof(long) * 256, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	double ours = run(clients, seconds, client, uri, contended);
	printf("%s %s, %d client(s), %.0f s: %.0f acquire+release pairs/s\n", uri,
	       contended ? "contended" : "uncontended", clients, seconds, ours);
#ifdef HAVE_SQLITE
	if (strncmp(uri, "sqlite://", 9) == 0) {
		char file[4096];
		snprintf(file, sizeof(file), "%s.baseline", uri + 9);
		double base = run(clients, seconds, baseline_adapter, file, 0);
		printf("baseline: %.0f BEGIN IMMEDIATE/COMMIT pairs/s on the same kind of file; ratio %.2f\n",
		       base, ours / base);
		unlink(file);
	}
#endif
	return 0;
}
