#include "core/internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * SHA-256 (FIPS 180-4), only for public holder ids: small, no dependency.
 * Inputs are short (a tag and an owner token), so one pass over a buffer.
 */
static const uint32_t K256[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n)
{
	return (x >> n) | (x << (32 - n));
}

static void sha256_block(uint32_t h[8], const unsigned char *b)
{
	uint32_t w[64], v[8];
	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 | (uint32_t)b[4 * i + 2] << 8 |
		       (uint32_t)b[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	memcpy(v, h, sizeof(v));
	for (int i = 0; i < 64; i++) {
		uint32_t t1 = v[7] + (ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) +
			      K256[i] + w[i];
		uint32_t t2 = (ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22)) +
			      ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
		memmove(v + 1, v, 7 * sizeof(v[0]));
		v[4] += t1;
		v[0] = t1 + t2;
	}
	for (int i = 0; i < 8; i++)
		h[i] += v[i];
}

/* SHA-256 of msg (len bytes) into out[32]. */
static void sha256(unsigned char out[32], const unsigned char *msg, size_t len)
{
	uint32_t h[8] = {
		0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
	};
	unsigned char b[64];
	size_t i = 0;
	for (; i + 64 <= len; i += 64)
		sha256_block(h, msg + i);
	size_t r = len - i;
	memset(b, 0, sizeof(b));
	memcpy(b, msg + i, r);
	b[r] = 0x80;
	if (r >= 56) {
		sha256_block(h, b);
		memset(b, 0, sizeof(b));
	}
	uint64_t bits = (uint64_t)len * 8;
	for (int k = 0; k < 8; k++)
		b[63 - k] = (unsigned char)(bits >> (8 * k));
	sha256_block(h, b);
	for (int k = 0; k < 8; k++) {
		out[4 * k] = (unsigned char)(h[k] >> 24);
		out[4 * k + 1] = (unsigned char)(h[k] >> 16);
		out[4 * k + 2] = (unsigned char)(h[k] >> 8);
		out[4 * k + 3] = (unsigned char)h[k];
	}
}

/* The tag keeps holder ids apart from any other hash of an owner token. */
#define HOLDER_ID_TAG "dlock holder id v1"

/* The public id of an owner token: DLOCK_HOLDER_ID_LEN hex digits (malloc'd). */
static char *holder_id(const char *owner)
{
	if (!owner || !*owner)
		return dlock_sys_strdup("");
	size_t olen = strlen(owner), tlen = sizeof(HOLDER_ID_TAG);
	unsigned char *m = malloc(tlen + olen), d[32];
	if (!m) {
		dlock_sys_oom();
		return NULL;
	}
	memcpy(m, HOLDER_ID_TAG, tlen); /* with its NUL: tag and owner cannot run together */
	memcpy(m + tlen, owner, olen);
	sha256(d, m, tlen + olen);
	free(m);
	char *id = malloc(DLOCK_HOLDER_ID_LEN + 1);
	if (!id) {
		dlock_sys_oom();
		return NULL;
	}
	dlock_sys_hex(id, d, DLOCK_HOLDER_ID_LEN / 2);
	return id;
}

dlock_lock_status *dlock_sys_status_add(dlock_lock_status **arr, size_t *count)
{
	dlock_lock_status *n = realloc(*arr, (*count + 1) * sizeof(**arr));
	if (!n) {
		dlock_sys_oom();
		return NULL;
	}
	*arr = n;
	memset(&n[*count], 0, sizeof(n[0]));
	n[*count].permits = 1;
	return &n[(*count)++];
}

dlock_holder *dlock_sys_status_add_holder(dlock_lock_status *st)
{
	dlock_holder *n = realloc(st->holders, (st->nholders + 1) * sizeof(*n));
	if (!n) {
		dlock_sys_oom();
		return NULL;
	}
	st->holders = n;
	memset(&n[st->nholders], 0, sizeof(n[0]));
	n[st->nholders].ttl_left_ms = -1;
	return &n[st->nholders++];
}

static void status_free_one(dlock_lock_status *st)
{
	for (size_t j = 0; j < st->nholders; j++) {
		free(st->holders[j].owner);
		free(st->holders[j].host);
		free(st->holders[j].id);
	}
	free(st->holders);
	free(st->name);
}

void dlock_status_free(dlock_lock_status *st, size_t count)
{
	if (!st)
		return;
	for (size_t i = 0; i < count; i++)
		status_free_one(&st[i]);
	free(st);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* m->status for every name m->list gives: valid lock names, once each. */
static int status_listed(const dlock_backend_methods *m, dlock_backend *be, dlock_lock_status **out, size_t *count)
{
	char **all = NULL;
	size_t n = 0, u = 0;
	int rc = m->list(be, &all, &n);
	if (!rc && n) {
		qsort(all, n, sizeof(*all), cmp_name);
		for (size_t i = 0; i < n; i++) {
			if ((u && !strcmp(all[u - 1], all[i])) || dlock_name_check(all[i]) != 0)
				free(all[i]); /* a duplicate, or a key under the prefix that is not ours */
			else
				all[u++] = all[i];
		}
		rc = u ? m->status(be, (const char *const *)all, u, out, count) : 0;
	} else {
		u = n;
	}
	for (size_t i = 0; i < u; i++)
		free(all[i]);
	free(all);
	if (!rc)
		dlock_error_clear(); /* a name check that failed above is not this call's error */
	return rc;
}

int dlock_store_status(dlock_store *s, const char *const *names, size_t nnames, dlock_lock_status **out, size_t *count)
{
	if (!s || !out || !count)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_store_status: NULL argument");
	*out = NULL;
	*count = 0;
	if (dlock__forked(s))
		return dlock__fork_error(s, "dlock_store_status");
	if (!names)
		nnames = 0;
	for (size_t i = 0; i < nnames; i++) {
		int rc = dlock_name_check(names[i]);
		if (rc)
			return rc;
	}
	if (!s->mt.status)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, s->mt.kind, NULL, "the %s store cannot report lock status",
				       s->mt.kind);
	if (!nnames && !s->mt.list)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, s->mt.kind, NULL,
				       "the %s store cannot list its locks: name them", s->mt.kind);
	pthread_mutex_lock(&s->be_mu);
	dlock__counted(s);
	int rc = !nnames ? status_listed(&s->mt, s->be, out, count) : s->mt.status(s->be, names, nnames, out, count);
	pthread_mutex_unlock(&s->be_mu);
	if (rc) {
		dlock_status_free(*out, *count);
		*out = NULL;
		*count = 0;
		return rc;
	}
	for (size_t i = 0; i < *count; i++) {
		dlock_lock_status *st = &(*out)[i];
		for (size_t j = 0; j < st->nholders; j++) {
			free(st->holders[j].id); /* a store never sets it; be sure */
			if (!(st->holders[j].id = holder_id(st->holders[j].owner))) {
				dlock_status_free(*out, *count);
				*out = NULL;
				*count = 0;
				return DLOCK_ENOMEM;
			}
		}
	}
	if (nnames == 0) {
		/* Listing every lock: stores may report names that have gone idle since
		 * they were listed; keep only those with holders or waiters. */
		size_t kept = 0;
		for (size_t i = 0; i < *count; i++) {
			dlock_lock_status *st = &(*out)[i];
			if (st->nholders || st->waiters)
				(*out)[kept++] = *st;
			else
				status_free_one(st);
		}
		*count = kept;
	}
	return 0;
}

void dlock_holder_clear(dlock_holder *h)
{
	if (!h)
		return;
	free(h->owner);
	free(h->host);
	free(h->id);
	memset(h, 0, sizeof(*h));
}

static bool id_ok(const char *id)
{
	if (!id || strlen(id) != DLOCK_HOLDER_ID_LEN)
		return false;
	for (const char *c = id; *c; c++)
		if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
			return false;
	return true;
}

/* Still listed: is the holder with this id among name's holders now? */
static int still_held(dlock_store *s, const char *name, const char *id, bool *held)
{
	dlock_lock_status *st = NULL;
	size_t n = 0;
	const char *names[1] = { name };
	int rc = dlock_store_status(s, names, 1, &st, &n);
	*held = false;
	for (size_t i = 0; !rc && i < n; i++)
		for (size_t j = 0; j < st[i].nholders; j++)
			if (st[i].holders[j].id && !strcmp(st[i].holders[j].id, id))
				*held = true;
	dlock_status_free(st, n);
	return rc;
}

int dlock_store_break(dlock_store *s, const char *name, const char *holder_id_text, dlock_holder *freed)
{
	if (freed)
		memset(freed, 0, sizeof(*freed));
	if (!s || !name || !holder_id_text)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_store_break: NULL argument");
	if (!id_ok(holder_id_text))
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "a holder id is %d lowercase hex digits (as 'dlock status' shows it)",
				       DLOCK_HOLDER_ID_LEN);
	if (!s->mt.release)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, s->mt.kind, NULL, "the %s store cannot release",
				       s->mt.kind);
	dlock_lock_status *st = NULL;
	size_t n = 0;
	const char *names[1] = { name };
	int rc = dlock_store_status(s, names, 1, &st, &n);
	if (rc)
		return rc;
	dlock_holder *h = NULL;
	for (size_t i = 0; i < n && !h; i++)
		for (size_t j = 0; j < st[i].nholders && !h; j++)
			if (st[i].holders[j].id && !strcmp(st[i].holders[j].id, holder_id_text))
				h = &st[i].holders[j];
	if (!h || !h->owner || !*h->owner) {
		dlock_status_free(st, n);
		return dlock_error_set(DLOCK_ENOTHELD, s->mt.kind, NULL,
				       "lock '%s' has no holder %s (gone already, or a wrong id)", name,
				       holder_id_text);
	}
	/* The store's owner-checked release, as for a hold attached from a handle. */
	dlock_request req;
	memset(&req, 0, sizeof(req));
	req.name = name;
	req.owner = h->owner;
	req.mode = h->mode;
	req.permits = h->mode != DLOCK_SHARED && n && st[0].permits ? st[0].permits : 1;
	req.ttl_ms = s->default_ttl_ms;
	req.queue_ttl_ms = DLOCK__QUEUE_TTL_MS;
	req.host = s->host;
	req.confirm = 1;
	pthread_mutex_lock(&s->be_mu);
	req.deadline_ms = dlock_clock_ms() + s->request_timeout_ms;
	dlock__counted(s);
	rc = s->mt.release(s->be, &req);
	pthread_mutex_unlock(&s->be_mu);
	bool held = false;
	if (rc == 0 || rc == DLOCK_ENOTHELD) {
		/* A store whose holds live on the holder's connection answers "not
		 * held" for another connection's hold: tell that from "gone". */
		dlock_sys_saved_error e;
		dlock_sys_error_save(&e);
		int src = still_held(s, name, holder_id_text, &held);
		dlock_sys_error_restore(&e);
		if (src == 0 && held)
			rc = dlock_error_set(DLOCK_ENOTSUPPORTED, s->mt.kind, NULL,
					     "the %s store cannot free a hold of another connection; end "
					     "the holder's process or session instead",
					     s->mt.kind);
	}
	if (rc == 0 && freed) {
		*freed = *h;
		memset(h, 0, sizeof(*h)); /* moved: not freed below */
	}
	dlock_status_free(st, n);
	return rc;
}
