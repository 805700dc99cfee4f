/*
 * parse.h — the pure parsing half of the etcd store (src/stores/etcd/parse.c),
 * exposed only so the libFuzzer target tests/fuzz/fuzz_etcd.c can feed it
 * hostile input. Internal: not installed, not part of the API.
 *
 * Everything here reads what an etcd member (or something pretending to be
 * one) sends back over the JSON gateway; none of it touches the network.
 */
#ifndef DLOCK_STORES_ETCD_PARSE_H
#define DLOCK_STORES_ETCD_PARSE_H

#include <dlock/dlock.h>
#include <json-c/json.h>

#include <stddef.h>
#include <stdint.h>

/* One key-value as read from a range answer (key and value base64-decoded). */
typedef struct kv {
	char *key;
	int64_t create_rev;
	int64_t lease;
	/* from the value */
	char *owner, *host;
	int pid;
	dlock_mode mode;
	unsigned permits;
} kv;

/* State of one /v3/watch stream read by dlock__etcd_watch_write. */
typedef struct watch_ctx {
	json_tokener *tok; /* carries an object split across chunks */
	int created;       /* the watch was registered */
	int64_t rev;       /* header revision of the "created" answer: events after it come */
	int done;          /* a DELETE, a cancel/compaction, an error or garbage: stop waiting */
} watch_ctx;

/* Standard base64 (with '=' padding) of len bytes; malloc'd, NULL on OOM. */
char *dlock__etcd_b64_encode(const void *data, size_t len);
/* Decode s into a NUL-terminated malloc'd buffer; *len (if given) gets the
 * byte count. NULL on a character outside the alphabet, or OOM. */
char *dlock__etcd_b64_decode(const char *s, size_t *len);
/* The lock name an escaped directory component (n bytes of s) stands for. */
char *dlock__etcd_unescape_name(const char *s, size_t n);

void dlock__etcd_kv_clear(kv *k);
void dlock__etcd_kvs_free(kv *k, size_t n);
/* One element of a "kvs" array; fields missing or malformed get defaults. */
int dlock__etcd_kv_parse(json_object *j, kv *out);
/* The kvs of responses[i].response_range of a Txn answer: 0 with *out and *n
 * (NULL/0 when empty), DLOCK_ESTORE when there is no such response. */
int dlock__etcd_txn_range(json_object *txn, size_t i, kv **out, size_t *n);

/* Apply one watch-stream object to w. */
void dlock__etcd_watch_object(watch_ctx *w, json_object *o);
/* libcurl write callback for the watch stream (newline-separated JSON objects,
 * split anywhere across chunks): returns len to go on, 0 once w->done. */
size_t dlock__etcd_watch_write(char *data, size_t size, size_t nmemb, void *ud);

#endif
