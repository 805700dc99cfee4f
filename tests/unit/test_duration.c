#include "testutil/testutil.h"

#include <string.h>

int main(void)
{
	/* clang-format off */
	static const struct {
		const char *text;
		long long ms;
	} good[] = {
		{ "250ms", 250 }, { "30s", 30000 }, { "5m", 300000 }, { "1h", 3600000 }, { "7", 7000 },
		{ "1.5s", 1500 }, { "0", 0 }, { "0.25", 250 }, { "2.5m", 150000 }, { "0ms", 0 },
		/* Go-style sequences and days */
		{ "1h30m", 5400000 }, { "1m30s", 90000 }, { "1d", 86400000 }, { "2h", 7200000 },
		{ "1h30m15s500ms", 5415500 }, { "1d12h", 129600000 }, { "1.5h", 5400000 }, { "500ms", 500 },
	};
	/* clang-format on */
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		int64_t ms = -1;
		CHECK_RC(dlock_duration_parse(&ms, good[i].text), 0);
		if (ms != good[i].ms) {
			fprintf(stderr, "%s parsed as %lld, wanted %lld\n", good[i].text, (long long)ms, good[i].ms);
			tu_failures++;
		}
	}
	static const char *bad[] = {
		"",   "-1s",   "s",    "10x", "1 s",    "1ss", " 5",  "1e3",    "99999999999999999999h", ".",     "5sm",
		"+3", "1h-5m", "1h30", "1x",  "1h 30m", "h1",  "1d2", "1h30mx", "9999999999999999d",     "1.5.5s"
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int64_t ms = 12345;
		CHECK_RC(dlock_duration_parse(&ms, bad[i]), DLOCK_EINVAL);
		CHECK(ms == 12345);
		CHECK(strstr(dlock_error_last()->message, "duration") != NULL);
	}
	CHECK_RC(dlock_duration_parse(NULL == NULL ? &(int64_t){ 0 } : NULL, NULL), DLOCK_EINVAL);
	return tu_done("unit.duration");
}
