/*
 * The store module loader (src/core/schemes.c), through the shared libdlock
 * as an application uses it: libdlock's own schemes cannot be taken by the
 * application, a missing module is named, a module loads on first use, and
 * threads that first use the same scheme at once all find it loaded.
 */
#include "testutil/testutil.h"

#include <dlock/sys/backend.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static int fake_open(dlock_backend **out, dlock_uri *uri)
{
	(void)uri;
	*out = NULL;
	return dlock_error_set(DLOCK_EUNAVAILABLE, "fake", NULL, "fake store: never opens");
}

/* Open uri; its code, and whether the message has `want` (NULL: any). */
static int open_rc(const char *uri, const char *want, bool *has)
{
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, uri);
	if (has)
		*has = want && strstr(dlock_error_last()->message, want) != NULL;
	if (rc == 0)
		dlock_store_close(s);
	else
		printf("  %s: %s: %s\n", uri, dlock_error_name(rc), dlock_error_last()->message);
	return rc;
}

static void *first_use(void *arg)
{
	int *rc = arg;
	*rc = open_rc("memcached://127.0.0.1:1?connect_timeout=500ms", NULL, NULL);
	return NULL;
}

int main(void)
{
	/* libdlock's own schemes are its own, their modules loaded or not */
	CHECK_RC(dlock_backend_register("redis", fake_open), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "libdlock's own") != NULL);
	CHECK_RC(dlock_backend_register("etcd", fake_open), DLOCK_EINVAL);
	CHECK_RC(dlock_backend_register("sqlite", fake_open), DLOCK_EINVAL);
	CHECK_RC(dlock_backend_register("mine", fake_open), 0);
	bool has = false;
	CHECK_RC(open_rc("mine://x", "never opens", &has), DLOCK_EUNAVAILABLE);
	CHECK(has);

	/* a module that is not where the loader looks: named, with what it needs */
	setenv("DLOCK_MODULE_DIR", "/nonexistent-dlock-modules", 1);
	CHECK_RC(open_rc("etcd://127.0.0.1:1", "/nonexistent-dlock-modules/store-etcd.so, which is missing", &has),
		 DLOCK_ENOTSUPPORTED);
	CHECK(has);
	unsetenv("DLOCK_MODULE_DIR");
	/* found beside libdlock: the store itself answers (nothing listens on port 1) */
	int rc = open_rc("etcd://127.0.0.1:1?connect_timeout=500ms", NULL, NULL);
	CHECK(rc != DLOCK_ENOTSUPPORTED && rc != DLOCK_EINVAL && rc != 0);
	/* still refused once the module has registered it */
	CHECK_RC(dlock_backend_register("etcd", fake_open), DLOCK_EINVAL);

	/* four threads' first use of one module: each finds its store */
	pthread_t t[4];
	int rcs[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, first_use, &rcs[i]);
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		CHECK(rcs[i] != DLOCK_ENOTSUPPORTED && rcs[i] != DLOCK_EINVAL && rcs[i] != 0);
	}
	return tu_done("unit.modules");
}
