/* What the Sentinel tests (redis_sentinel.c, redis_sentinel_wait.c) share
 * beyond redis_common_test.h (header-only, test code). */
#ifndef DLOCK_TEST_REDIS_SENTINEL_H
#define DLOCK_TEST_REDIS_SENTINEL_H

#include "stores/redis_common_test.h"
#include "core/internal.h"

/* Open `text` (redis+sentinel://...) through the backend (dlock__redis_open +
 * dlock_store_open_backend), so that the test does not depend on the
 * scheme table naming "redis+sentinel". */
static inline int rt_open_sentinel(dlock_store **out, const char *text)
{
	dlock_uri *u = NULL;
	dlock_backend *be = NULL;
	int rc = dlock_sys_uri_parse(&u, text);
	if (!rc)
		rc = dlock__redis_open(&be, u);
	if (!rc && (rc = dlock_sys_uri_check_unused(u)) != 0)
		be->methods->close(be);
	dlock_sys_uri_free(u);
	if (rc)
		return rc;
	return dlock_store_open_backend(out, be, text, 30000);
}

#endif
