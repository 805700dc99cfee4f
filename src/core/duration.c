#include "core/internal.h"

#include <string.h>

/* The unit at p (longest match first), its length in *len; 0 if none. */
static int64_t unit_at(const char *p, size_t *len)
{
	static const struct {
		const char *name;
		int64_t ms;
	} units[] = { { "ms", 1 }, { "s", 1000 }, { "m", 60 * 1000 }, { "h", 3600 * 1000 }, { "d", 86400 * 1000 } };
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		size_t n = strlen(units[i].name);
		if (strncmp(p, units[i].name, n) == 0) {
			*len = n;
			return units[i].ms;
		}
	}
	return 0;
}

static int bad(const char *text, const char *why)
{
	return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "bad duration '%s': %s (e.g. 250ms, 30s, 5m, 1h30m, 1d)", text,
			       why);
}

int dlock_duration_parse(int64_t *ms, const char *text)
{
	if (!text || !*text)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "empty duration (e.g. 250ms, 30s, 5m, 1h30m, 1d)");
	const char *p = text;
	int64_t total = 0;
	int parts = 0;
	while (*p) {
		int64_t whole = 0, frac = 0, frac_scale = 1;
		int digits = 0;
		for (; *p >= '0' && *p <= '9'; p++, digits++) {
			if (whole > INT64_MAX / 10 - 10)
				return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "duration '%s' is too large", text);
			whole = whole * 10 + (*p - '0');
		}
		if (*p == '.') {
			p++;
			for (; *p >= '0' && *p <= '9'; p++, digits++) {
				if (frac_scale < 1000000000) {
					frac = frac * 10 + (*p - '0');
					frac_scale *= 10;
				}
			}
		}
		if (digits == 0)
			return bad(text, "expected a number");
		size_t len = 0;
		int64_t unit = unit_at(p, &len);
		if (!unit && *p)
			return bad(text, "unknown unit (use ms, s, m, h or d)");
		if (!unit && parts > 0)
			return bad(text, "a number without a unit after another part");
		if (!unit)
			unit = 1000; /* a bare number is seconds */
		p += len;
		if (whole > INT64_MAX / unit / 4 || total > INT64_MAX / 4)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "duration '%s' is too large", text);
		total += whole * unit + frac * unit / frac_scale;
		parts++;
	}
	*ms = total;
	return 0;
}
