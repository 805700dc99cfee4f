#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local struct {
	dlock_error err;
	char message[512];
	char store[32];
	char store_code[64];
} last = { { 0, "no error", "", "" }, "no error", "", "" };

const dlock_error *dlock_error_last(void)
{
	last.err.message = last.message;
	last.err.store = last.store;
	last.err.store_code = last.store_code;
	return &last.err;
}

void dlock_error_clear(void)
{
	last.err.code = 0;
	snprintf(last.message, sizeof(last.message), "no error");
	last.store[0] = '\0';
	last.store_code[0] = '\0';
}

int dlock_sys_error_vset(int code, const char *store, const char *store_code, const char *fmt, va_list ap)
{
	/* Format apart first: an argument may be the last message itself
	 * ("option ttl: %s", dlock_error_last()->message), or the store names. */
	char msg[sizeof(last.message)], st[sizeof(last.store)], sc[sizeof(last.store_code)];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	snprintf(st, sizeof(st), "%s", store ? store : "");
	snprintf(sc, sizeof(sc), "%s", store_code ? store_code : "");
	last.err.code = code;
	memcpy(last.message, msg, sizeof(msg));
	memcpy(last.store, st, sizeof(st));
	memcpy(last.store_code, sc, sizeof(sc));
	return code;
}

int dlock_error_set(int code, const char *store, const char *store_code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	dlock_sys_error_vset(code, store, store_code, fmt, ap);
	va_end(ap);
	return code;
}

void dlock_sys_error_save(dlock_sys_saved_error *e)
{
	e->code = last.err.code;
	snprintf(e->message, sizeof(e->message), "%s", last.message);
	snprintf(e->store, sizeof(e->store), "%s", last.store);
	snprintf(e->store_code, sizeof(e->store_code), "%s", last.store_code);
}

void dlock_sys_error_restore(const dlock_sys_saved_error *e)
{
	if (e->code)
		dlock_error_set(e->code, e->store, e->store_code, "%s", e->message);
	else
		dlock_error_clear();
}

int dlock_sys_oom(void)
{
	return dlock_error_set(DLOCK_ENOMEM, NULL, NULL, "out of memory");
}

static const struct {
	int code;
	const char *name;
	const char *text;
} codes[] = {
	{ DLOCK_OK, "DLOCK_OK", "success" },
	{ DLOCK_EINVAL, "DLOCK_EINVAL", "invalid argument" },
	{ DLOCK_ENOMEM, "DLOCK_ENOMEM", "out of memory" },
	{ DLOCK_ETIMEOUT, "DLOCK_ETIMEOUT", "not acquired within the wait" },
	{ DLOCK_ELOCKED, "DLOCK_ELOCKED", "lock is held by another owner" },
	{ DLOCK_ENOTHELD, "DLOCK_ENOTHELD", "lock not held by this owner" },
	{ DLOCK_ELOST, "DLOCK_ELOST", "lock was lost (lease ended)" },
	{ DLOCK_EUNAVAILABLE, "DLOCK_EUNAVAILABLE", "store unavailable" },
	{ DLOCK_EAUTH, "DLOCK_EAUTH", "authentication failed" },
	{ DLOCK_ENOTSUPPORTED, "DLOCK_ENOTSUPPORTED", "not supported by this store or build" },
	{ DLOCK_ESTORE, "DLOCK_ESTORE", "unexpected store error" },
	{ DLOCK_EBUSY, "DLOCK_EBUSY", "lock handle busy" },
};

const char *dlock_strerror(int code)
{
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		if (codes[i].code == code)
			return codes[i].text;
	return "unknown error";
}

const char *dlock_error_name(int code)
{
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		if (codes[i].code == code)
			return codes[i].name;
	return "DLOCK_E?";
}

/* ---- small memory helpers ---- */

char *dlock_sys_strdup(const char *s)
{
	char *p = strdup(s ? s : "");
	if (!p)
		dlock_sys_oom();
	return p;
}

void dlock_sys_free_secret(char *s)
{
	if (!s)
		return;
	explicit_bzero(s, strlen(s)); /* a memset before free may be optimised away */
	free(s);
}

char *dlock_sys_strndup(const char *s, size_t n)
{
	char *p = strndup(s, n);
	if (!p)
		dlock_sys_oom();
	return p;
}

char *dlock_sys_sprintf(const char *fmt, ...)
{
	va_list ap;
	char *p = NULL;
	va_start(ap, fmt);
	if (vasprintf(&p, fmt, ap) < 0)
		p = NULL;
	va_end(ap);
	if (!p)
		dlock_sys_oom();
	return p;
}

void *dlock_sys_calloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		dlock_sys_oom();
	return p;
}

void dlock_sys_hex(char *out, const void *bytes, size_t len)
{
	static const char digits[] = "0123456789abcdef";
	const unsigned char *b = bytes;
	for (size_t i = 0; i < len; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[2 * len] = '\0';
}

void dlock_free(void *ptr)
{
	free(ptr);
}

const char *dlock_version(void)
{
	return DLOCK_VERSION_STRING;
}
