/* The smallest program that uses libdlock: take a lock on the default
 * (embedded) store, print its fence, release it. */
#include <dlock/dlock.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	dlock_store *store;
	if (dlock_store_open(&store, argc > 1 ? argv[1] : NULL) != 0) {
		fprintf(stderr, "open: %s\n", dlock_error_last()->message);
		return 69;
	}
	dlock_lock_options opts = DLOCK_LOCK_OPTIONS_INIT;
	opts.ttl_ms = 10000;
	dlock_lock *lock;
	int rc = dlock_lock_new(&lock, store, "examples/hello", &opts);
	if (rc == 0)
		rc = dlock_acquire(lock, 5000);
	if (rc == 0) {
		printf("holding '%s' with fence %llu on %s\n", dlock_lock_name(lock),
		       (unsigned long long)dlock_fence(lock), dlock_store_uri(store));
		rc = dlock_release(lock);
	}
	if (rc != 0)
		fprintf(stderr, "lock: %s\n", dlock_error_last()->message);
	dlock_lock_free(lock);
	dlock_store_close(store);
	return rc == 0 ? 0 : 1;
}
