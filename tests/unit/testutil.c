#include "unit/testutil.h"

#include <time.h>

int tu_failures;

int tu_done(const char *suite)
{
	if (tu_failures) {
		fprintf(stderr, "%s: %d check(s) FAILED\n", suite, tu_failures);
		return 1;
	}
	printf("%s: all checks passed\n", suite);
	return 0;
}

long long tu_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
