/*
 * What the files of the etcd store share: the store handle, its leases and
 * holds. gateway.c (HTTP to the v3 JSON gateway: failover, auth, deadlines),
 * parse.c (JSON in and out, names; parse.h, fuzzed), lease.c, lock.c (the
 * lock protocol), watch.c (waits), status.c, etcd.c (open/close). The key
 * layout and the protocol: etcd.c's header comment and docs/stores/etcd.md.
 */
#ifndef DLOCK_STORES_ETCD_ETCD_H
#define DLOCK_STORES_ETCD_ETCD_H

#include "../support.h"
#include "parse.h"

#include <curl/curl.h>
#include <json-c/json.h>

#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define KIND "etcd"
#define MAX_LEASES 16
#define POOL_MAX 4
/* etcd's default --max-txn-ops */
#define TXN_MAX_OPS 128
/* gRPC status codes the gateway returns in {"code": N} */
#define GRPC_DEADLINE_EXCEEDED 4
#define GRPC_NOT_FOUND 5
#define GRPC_PERMISSION_DENIED 7
#define GRPC_UNAVAILABLE 14
#define GRPC_UNAUTHENTICATED 16

typedef struct lease {
	int64_t ttl_s;       /* what we asked for; the table key */
	int64_t granted_s;   /* what etcd granted (it raises small TTLs) */
	int64_t id;
	int64_t alive_until; /* CLOCK_MONOTONIC ms: send time of the last grant/keepalive + TTL */
	int64_t touched;     /* CLOCK_MONOTONIC ms of that send */
	int pinned;          /* carries a key of another process (extend of an attached hold): never revoke */
	int retired;         /* carries an orphan (a key whose delete failed): never kept alive
				again nor given new keys; revoked once no live key of ours rides on it */
} lease;

/* Which key of a name an owner of this store handle uses. */
typedef struct hold {
	char *name;
	char owner[64];
	unsigned slot;
	int64_t lease; /* the lease its key rides on, once known */
	int64_t maybe; /* a lease a put of unknown outcome may have moved it to (0: none) */
	int orphan;    /* its delete failed: the key may still be there, nobody wants it */
} hold;

/* A waiter's pair of transfers, pooled: the watch stream and a read beside
 * it, on a multi handle whose connection cache keeps the read's connection. */
typedef struct waitkit {
	CURLM *multi;
	CURL *watch, *read;
} waitkit;

typedef struct etcd_store {
	dlock_backend base;
	char **urls;
	size_t nurls;
	dlock_hostport *hp;   /* urls[i]'s host and port (resolved before each request) */
	char *prefix;
	char *user, *password;
	char *cacert, *cert, *key;
	long connect_timeout_ms;
	long request_timeout_ms;

	pthread_mutex_t mu;
	size_t cur;           /* endpoint in use (failover moves it) */
	char *token;          /* auth token or NULL */
	unsigned token_gen;
	waitkit *pool[POOL_MAX];
	size_t npool;

	CURL *cmd;            /* under the store mutex */
	CURL *side;           /* a second request in flight next to cmd (keepalive during acquire) */
	CURLM *multi;         /* runs cmd and side: one connection cache for both */
	long op_timeout_ms;   /* per-attempt limit for cmd requests while renewing; 0: none */
	int64_t deadline;     /* CLOCK_MONOTONIC ms by which the current call (cmd, side) must end */
	CURL **hedge;         /* 2 x nurls handles (made when first needed) that race cmd's
				 [0..nurls) and side's [nurls..2 nurls) request on the next
				 members: gateway.c "Hedging" */
	int reached;          /* during the current call a member took a request on cmd or side
				 (answered, or accepted it and stayed silent): the cluster is
				 there, if not serving (dlock_grant.reached) */
	lease leases[MAX_LEASES];
	size_t nleases;

	hold *holds;          /* key slots of our holds and waiters, under mu (wait reads them) */
	size_t nholds, capholds;
} etcd_store;

/* ---- what the files of this store share ---- */

/* dlock__et_names_make: find the hold's key, or make one. */
enum { MK_LOOKUP, MK_CREATE };

/* Flags of dlock__et_op_range: keys only; served by the member we ask, without
 * the leader (stale by a moment at most). */
#define R_KEYS_ONLY 1
#define R_SERIALIZABLE 2

/* One HTTP exchange being prepared, run and read. */
typedef struct xfer {
	CURL *h;
	char *url;
	struct curl_slist *hd;
	dlock_sys_sbuf b;
	size_t idx;    /* endpoint */
	struct curl_slist *pin; /* CURLOPT_RESOLVE: the endpoint's name pinned to its addresses */
	bool unresolved; /* the endpoint's name did not resolve in time: try the next */
	unsigned gen;  /* token generation sent */
	CURLcode c;
	long status;
	int64_t until; /* its deadline */
} xfer;

typedef struct rpc_result {
	int grpc;      /* gRPC code of an error answer, else 0 */
	int ambiguous; /* an earlier attempt may have been applied */
} rpc_result;

typedef struct keyset {
	char *dir, *end, *key; /* key NULL: not a hold of this store handle (see find_by_owner) */
} keyset;

CURL *dlock__et_handle_new(etcd_store *e);

void dlock__et_kit_free(waitkit *k);

waitkit *dlock__et_kit_take(etcd_store *e);

void dlock__et_kit_put(etcd_store *e, waitkit *k);

int dlock__et_curl_failover(CURLcode c);

void dlock__et_endpoint_failed(etcd_store *e, size_t idx);

int dlock__et_xfer_start(etcd_store *e, xfer *x, CURL *h, const char *path, const char *text, int64_t until,
			 int with_token);

void dlock__et_xfer_end(xfer *x);

int dlock__et_rpc(etcd_store *e, CURL *h, const char *path, json_object *body, json_object **out, rpc_result *res);

int dlock__et_authenticate(etcd_store *e, CURL *h, unsigned seen_gen, int64_t until);

int dlock__et_rpc_until(etcd_store *e, CURL *h, const char *path, json_object *body, json_object **out, rpc_result *res,
			int64_t until);

void dlock__et_rpc_pair(etcd_store *e, const char *path1, json_object *body1, json_object **out1, int *rc1,
			rpc_result *res1, const char *path2, json_object *body2, json_object **out2, int *rc2);

void dlock__et_lease_drop(etcd_store *e, int64_t id);

lease *dlock__et_lease_find_id(etcd_store *e, int64_t id);

json_object *dlock__et_keepalive_body(int64_t id);

int dlock__et_keepalive(etcd_store *e, int64_t id, int64_t *ttl_s);

int dlock__et_keepalive_read(etcd_store *e, int64_t id, json_object *resp, int64_t sent, int64_t *ttl_s);

int dlock__et_lease_get(etcd_store *e, int64_t ttl_ms, lease **out);

void dlock__et_names_free(keyset *n);

int dlock__et_holds(const kv *keys, size_t n, const kv *me, dlock_mode mode, unsigned permits, const kv **watch);

int dlock__et_names_make(etcd_store *e, const dlock_request *req, keyset *n, int how);

void dlock__et_call_begin(etcd_store *e, int64_t deadline);

int dlock__et_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out);

int dlock__et_release(dlock_backend *be, const dlock_request *req);

int dlock__et_cancel(dlock_backend *be, const dlock_request *req);

int dlock__et_extend(dlock_backend *be, const dlock_request *req, int64_t ttl_ms);

int dlock__et_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results);

json_object *dlock__et_jget(json_object *o, const char *k);

int64_t dlock__et_jint(json_object *o, const char *k);

const char *dlock__et_jstr(json_object *o, const char *k);

int dlock__et_jbool(json_object *o, const char *k);

int dlock__et_jadd_b64(json_object *o, const char *k, const char *data, size_t len);

void dlock__et_jadd_i64(json_object *o, const char *k, int64_t v);

char *dlock__et_dir_of(const etcd_store *e, const char *name);

char *dlock__et_prefix_enc(const char *prefix);

char *dlock__et_range_end(const char *dir);

json_object *dlock__et_op_range(const char *key, const char *end, int by_create, int64_t limit, int flags);

json_object *dlock__et_op_put(const char *key, const char *value, int64_t lease_id, int ignore_value);

json_object *dlock__et_cmp_create(const char *key, const char *end, const char *result, int64_t rev);

int dlock__et_txn(etcd_store *e, CURL *h, json_object *compare, json_object *success, json_object *failure,
		  json_object **out, rpc_result *res);

int dlock__et_delete_key(etcd_store *e, CURL *h, const char *key, int64_t *deleted, rpc_result *res);

int dlock__et_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		     size_t *count);

int dlock__et_list(dlock_backend *be, char ***names, size_t *count);

int dlock__et_wait(dlock_backend *be, const dlock_request *req, int64_t timeout_ms, dlock_grant *out);

#endif
