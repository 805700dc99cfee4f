/* 16 processes open the same brand-new SQLite store file at the same moment
 * (released together by a pipe), 20 rounds: every open succeeds. */
#include "testutil/testutil.h"

#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROCS 16
#define ROUNDS 20

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	mkdir(argv[1], 0700);
	for (int round = 0; round < ROUNDS; round++) {
		char uri[600], base[520];
		snprintf(base, sizeof(base), "%s/fresh-%d.db", argv[1], round);
		unlink(base);
		for (int k = 0; k < 2; k++) { /* an earlier run's WAL files would make it not fresh */
			char side[600];
			snprintf(side, sizeof(side), "%s%s", base, k ? "-shm" : "-wal");
			unlink(side);
		}
		snprintf(uri, sizeof(uri), "sqlite://%s", base);
		int go[2];
		if (pipe(go) != 0)
			return 2;
		pid_t pids[PROCS];
		for (int i = 0; i < PROCS; i++) {
			pids[i] = fork();
			if (pids[i] == 0) {
				char c;
				close(go[1]);
				if (read(go[0], &c, 1) != 0)
					_exit(3);
				dlock_store *s;
				int rc = dlock_store_open(&s, uri);
				if (rc != 0) {
					fprintf(stderr, "open failed: %s\n", dlock_error_last()->message);
					_exit(1);
				}
				dlock_store_close(s);
				_exit(0);
			}
		}
		close(go[0]);
		close(go[1]); /* everyone starts now */
		int failed = 0;
		for (int i = 0; i < PROCS; i++) {
			int st;
			waitpid(pids[i], &st, 0);
			failed += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
		}
		CHECK(failed == 0);
		if (failed)
			fprintf(stderr, "round %d: %d of %d opens failed\n", round, failed, PROCS);
	}
	return tu_done("sqlite.fresh_file");
}
