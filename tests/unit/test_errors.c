#include "testutil/testutil.h"

#include <dlock/sys/backend.h>
#include "stores/support.h"
#include <pthread.h>
#include <string.h>

static void *other_thread(void *arg)
{
	(void)arg;
	/* The last error is per thread: a fresh thread has none. */
	const dlock_error *e = dlock_error_last();
	return (void *)(long)(e->code == 0 && strcmp(e->message, "no error") == 0);
}

int main(void)
{
	const dlock_error *e = dlock_error_last();
	CHECK(e != NULL && e->code == 0);
	/* Codes are part of the ABI: never renumbered. */
	CHECK(DLOCK_EINVAL == -1 && DLOCK_ENOMEM == -2 && DLOCK_ETIMEOUT == -3 && DLOCK_ELOCKED == -4);
	CHECK(DLOCK_ENOTHELD == -5 && DLOCK_ELOST == -6 && DLOCK_EUNAVAILABLE == -7 && DLOCK_EAUTH == -8);
	CHECK(DLOCK_ENOTSUPPORTED == -9 && DLOCK_ESTORE == -10 && DLOCK_EBUSY == -11);
	for (int c = 0; c >= DLOCK_EBUSY; c--) {
		CHECK(strcmp(dlock_strerror(c), "unknown error") != 0);
		CHECK(strncmp(dlock_error_name(c), "DLOCK_", 6) == 0 && strcmp(dlock_error_name(c), "DLOCK_E?") != 0);
	}
	CHECK(strcmp(dlock_strerror(-999), "unknown error") == 0);
	CHECK(strcmp(dlock_error_name(DLOCK_ETIMEOUT), "DLOCK_ETIMEOUT") == 0);

	/* A message may quote the last one: formatted apart, nothing doubled or cut. */
	dlock_error_set(DLOCK_EINVAL, NULL, NULL, "bad duration 'abc': expected a number");
	dlock_error_set(DLOCK_EINVAL, NULL, NULL, "store URI option ttl: %s", dlock_error_last()->message);
	CHECK(strcmp(dlock_error_last()->message, "store URI option ttl: bad duration 'abc': expected a number") == 0);

	/* Passwords are scrubbed from server messages where they stand as words. */
	char m1[128] = "Got packet bigger than 'max_allowed_packet' bytes";
	dlock_sys_scrub(m1, sizeof m1, "p");
	CHECK(strcmp(m1, "Got packet bigger than 'max_allowed_packet' bytes") == 0);
	char m2[128] = "Access denied for user 'u' using password 'hunter2' (p)";
	dlock_sys_scrub(m2, sizeof m2, "hunter2");
	CHECK(strcmp(m2, "Access denied for user 'u' using password '***' (p)") == 0);
	dlock_sys_scrub(m2, sizeof m2, "p");
	CHECK(strcmp(m2, "Access denied for user 'u' using password '***' (***)") == 0);
	char m3[128] = "secret=s3@cr%t! and s3@cr%t!";
	dlock_sys_scrub(m3, sizeof m3, "s3@cr%t!");
	CHECK(strcmp(m3, "secret=*** and ***") == 0);

	CHECK(dlock_error_set(DLOCK_ESTORE, "redis", "WRONGTYPE", "reply was %d", 42) == DLOCK_ESTORE);
	e = dlock_error_last();
	CHECK(e->code == DLOCK_ESTORE && strcmp(e->message, "reply was 42") == 0);
	CHECK(strcmp(e->store, "redis") == 0 && strcmp(e->store_code, "WRONGTYPE") == 0);

	pthread_t t;
	void *ok = NULL;
	pthread_create(&t, NULL, other_thread, NULL);
	pthread_join(t, &ok);
	CHECK(ok == (void *)1L);
	CHECK(dlock_error_last()->code == DLOCK_ESTORE); /* ours is untouched */
	dlock_error_clear();
	CHECK(dlock_error_last()->code == 0);
	CHECK(strcmp(dlock_version(), DLOCK_VERSION_STRING) == 0);
	return tu_done("unit.errors");
}
