/*
 * libFuzzer: what an etcd member (or anything answering on its port) sends
 * back. The first byte picks the part under test:
 *   0  a Txn answer: responses[i].response_range.kvs, base64 keys and values
 *      holding our JSON value ({"owner","mode","permits",...})
 *   1  the /v3/watch stream, cut into chunks at places the input chooses
 *      (an object may span chunks; garbage must end the wait, not crash)
 *   2  base64 both ways (decode of garbage; encode/decode round trip)
 *   3  directory-name unescaping, and the round trip of our own escaping
 */
#include "core/internal.h"
#include "stores/etcd/parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void txn_answer(const char *text)
{
	json_object *j = json_tokener_parse(text);
	for (size_t i = 0; i < 3; i++) {
		kv *k = NULL;
		size_t n = 0;
		if (dlock__etcd_txn_range(j, i, &k, &n) != 0) {
			if (k || n)
				abort(); /* an error leaves nothing to free */
			continue;
		}
		for (size_t x = 0; x < n; x++)
			if (k[x].permits < 1 || k[x].permits >= 1000000 ||
			    (k[x].mode != DLOCK_SHARED && k[x].mode != DLOCK_EXCLUSIVE))
				abort();
		dlock__etcd_kvs_free(k, n);
	}
	json_object_put(j);
}

static void watch_stream(const uint8_t *data, size_t size)
{
	if (size < 1)
		return;
	unsigned step = data[0] % 16 + 1; /* chunk length: 1..16, then per chunk from the data */
	data++;
	size--;
	char *copy = malloc(size ? size : 1); /* curl hands a non-const buffer */
	if (!copy)
		return;
	memcpy(copy, data, size);
	watch_ctx w = { 0 };
	w.tok = json_tokener_new();
	size_t off = 0;
	while (w.tok && off < size && !w.done) {
		size_t len = size - off < step ? size - off : step;
		size_t r = dlock__etcd_watch_write(copy + off, 1, len, &w);
		if (r != (w.done ? 0 : len))
			abort(); /* 0 exactly when done, else everything taken */
		off += len;
		step = (unsigned char)copy[off - 1] % 16 + 1;
	}
	if (w.tok)
		json_tokener_free(w.tok);
	free(copy);
}

static void base64(const uint8_t *data, size_t size, const char *text)
{
	size_t n = 0;
	char *d = dlock__etcd_b64_decode(text, &n);
	if (d) {
		char *e = dlock__etcd_b64_encode(d, n);
		size_t n2 = 0;
		char *d2 = e ? dlock__etcd_b64_decode(e, &n2) : NULL;
		if (e && (!d2 || n2 != n || memcmp(d, d2, n) != 0))
			abort();
		free(d2);
		free(e);
		free(d);
	}
	char *e = dlock__etcd_b64_encode(data, size);
	if (e) {
		char *back = dlock__etcd_b64_decode(e, &n);
		if (!back || n != size || memcmp(back, data, size) != 0)
			abort();
		free(back);
		free(e);
	}
}

static void names(const char *text, size_t size)
{
	char *u = dlock__etcd_unescape_name(text, size);
	free(u);
	/* The store escapes '%' and '/' as %XX (src/stores/etcd/parse.c, dir_of). */
	size_t len = strlen(text);
	char *esc = malloc(3 * len + 1), *o = esc;
	if (!esc)
		return;
	for (const char *p = text; *p; p++) {
		if (*p == '%' || *p == '/')
			o += sprintf(o, "%%%02X", (unsigned char)*p);
		else
			*o++ = *p;
	}
	*o = '\0';
	u = dlock__etcd_unescape_name(esc, (size_t)(o - esc));
	if (u && strcmp(u, text) != 0)
		abort();
	free(u);
	free(esc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 65536)
		return 0;
	int what = data[0] % 4;
	data++;
	size--;
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	switch (what) {
	case 0:
		txn_answer(text);
		break;
	case 1:
		watch_stream(data, size);
		break;
	case 2:
		base64(data, size, text);
		break;
	default:
		names(text, size);
		break;
	}
	free(text);
	return 0;
}
