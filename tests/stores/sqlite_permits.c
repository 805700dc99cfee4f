/* Mixed limits on one name (issue 15 row 6). The rule for every store: the
 * smallest limit among the holders and the requester applies, and a mutex
 * (permits 1, exclusive) excludes everything. So a semaphore caller is not
 * admitted beside a mutex holder, a mutex caller not beside a semaphore
 * holder, and a semaphore of 3 beside one of 2 only while fewer than 2 hold. */
#include "testutil/testutil.h"

#include <sys/stat.h>
#include <unistd.h>

static dlock_store *s;

static dlock_lock *mk(const char *name, unsigned permits, int fair)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.permits = permits;
	o.fair = fair;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, name, &o), 0);
	return l;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	mkdir(argv[1], 0700);
	char path[600], uri[700];
	snprintf(path, sizeof(path), "%s/permits.db", argv[1]);
	unlink(path);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return tu_done("sqlite.permits");

	/* A mutex holder excludes a semaphore of 3, fair or not, waiting or not. */
	dlock_lock *mutex = mk("a", 1, 0), *sem = mk("a", 3, 0), *fsem = mk("a", 3, 1);
	CHECK_RC(dlock_acquire(mutex, 0), 0);
	CHECK_RC(dlock_acquire(sem, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_acquire(fsem, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_acquire(sem, 200), DLOCK_ETIMEOUT);
	CHECK_RC(dlock_release(mutex), 0);
	/* A semaphore holder excludes a mutex. */
	CHECK_RC(dlock_acquire(sem, 0), 0);
	CHECK_RC(dlock_acquire(mutex, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(sem), 0);
	CHECK_RC(dlock_acquire(mutex, 0), 0);
	CHECK_RC(dlock_release(mutex), 0);
	dlock_lock_free(mutex);
	dlock_lock_free(sem);
	dlock_lock_free(fsem);

	/* A semaphore of 2 held once: a semaphore of 3 may join (2 holders, the
	 * smaller limit), then no third holder, whichever limit it asks. */
	dlock_lock *two = mk("b", 2, 0), *three = mk("b", 3, 0), *three2 = mk("b", 3, 0), *two2 = mk("b", 2, 0);
	CHECK_RC(dlock_acquire(two, 0), 0);
	CHECK_RC(dlock_acquire(three, 0), 0);
	CHECK_RC(dlock_acquire(three2, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_acquire(two2, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(two), 0);
	CHECK_RC(dlock_acquire(three2, 0), 0); /* now two semaphores of 3 */
	CHECK_RC(dlock_acquire(two2, 0), DLOCK_ELOCKED);
	dlock_lock *three3 = mk("b", 3, 0);
	CHECK_RC(dlock_acquire(three3, 0), 0); /* the third of 3 */
	CHECK_RC(dlock_acquire(two, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(three), 0);
	CHECK_RC(dlock_release(three2), 0);
	CHECK_RC(dlock_release(three3), 0);
	dlock_lock_free(two);
	dlock_lock_free(three);
	dlock_lock_free(three2);
	dlock_lock_free(two2);
	dlock_lock_free(three3);

	/* A shared holder still excludes semaphores, and a semaphore holder readers. */
	dlock_lock_options ro = DLOCK_LOCK_OPTIONS_INIT;
	ro.mode = DLOCK_SHARED;
	dlock_lock *reader = NULL;
	CHECK_RC(dlock_lock_new(&reader, s, "c", &ro), 0);
	sem = mk("c", 3, 0);
	CHECK_RC(dlock_acquire(reader, 0), 0);
	CHECK_RC(dlock_acquire(sem, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(reader), 0);
	CHECK_RC(dlock_acquire(sem, 0), 0);
	CHECK_RC(dlock_acquire(reader, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(sem), 0);
	dlock_lock_free(reader);
	dlock_lock_free(sem);
	dlock_store_close(s);
	return tu_done("sqlite.permits");
}
