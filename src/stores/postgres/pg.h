/*
 * What the files of the PostgreSQL store share (postgres://…?mode=table|advisory):
 * the store handle, connections bounded by the caller's deadline (conn.c),
 * LISTEN/NOTIFY wake-ups (notify.c), table mode (table.c, schema.sql) and
 * advisory mode (advisory.c); open/close and the method tables: postgres.c.
 * See docs/stores/postgres.md for the failure model.
 */
#ifndef DLOCK_STORES_POSTGRES_PG_H
#define DLOCK_STORES_POSTGRES_PG_H

#include "../support.h"

#include <libpq-events.h>
#include <libpq-fe.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KIND "postgres"
#define SCHEMA_VERSION 4 /* 2: the permits rule; 3: fast path, marked holds (only their release notifies);
                            4: advisory fences from a sequence */
#define STR_(x) #x
#define STR(x) STR_(x)
#define CHANNEL "dlock_wake"
#define POOL_MAX 8
/* TCP settings of every connection (see connect_db). */
#define KEEPALIVE_IDLE_S 5
#define KEEPALIVE_INTERVAL_S 2
#define KEEPALIVE_COUNT 3
#define TCP_USER_TIMEOUT_MS 10000
/* pg_advisory_xact_lock key that serialises schema creation ("dlockSCH"). */
#define SCHEMA_LOCK_KEY "7236281174070608712"

typedef struct postgres_store {
	dlock_backend base;
	char *host, *port, *user, *password, *dbname, *sslmode;
	char *sslrootcert, *sslcert, *sslkey; /* TLS files, passed to libpq as they are */
	char *ns;
	int advisory;
	int64_t connect_timeout_ms; /* bound of one connect (and of the open) */
	int64_t request_timeout_ms; /* bound of status, and of a call without a deadline */
	PGconn *conn; /* under the store mutex */
	unsigned prepared; /* bits of stmts[] prepared on conn */

	/* LISTEN connection and its thread; everything below under lmu */
	pthread_mutex_t lmu;
	PGconn *lconn;
	int lthread_on, lstop;
	pthread_t lthread;
	int wakefd[2];

	/* advisory mode: idle connections, and the sessions waiters keep (intent) */
	PGconn *pool[POOL_MAX];
	int npool;
	struct intent *intents;
} postgres_store;

/* The session a waiter keeps between its tries in advisory mode: it holds
 * the name's "waiting" key shared (so that releases notify), and a waiting
 * writer also the name's "writer intent" key, so that new readers back off
 * (writer preference). */
typedef struct intent {
	struct intent *next;
	char owner[64];
	PGconn *conn;
	int writer; /* holds the writer intent key */
} intent;

/* Per-hold state in advisory mode (req->slot). */
typedef struct adv_hold {
	PGconn *conn;
	int64_t key;
	int shared;
	int32_t sem_class;  /* a semaphore hold: its (class, permits) key, shared; else 0 */
	unsigned sem_permits;
} adv_hold;

/* ---- what the files of this store share ---- */

/* One method table per mode (table.c, advisory.c); both close with dlock__pg_close. */
extern const dlock_backend_methods dlock__pg_table_methods;
extern const dlock_backend_methods dlock__pg_advisory_methods;
void dlock__pg_close(dlock_backend *base);

/* Prepared statements of table mode (conn.c: their SQL). */
enum { S_ACQUIRE, S_RELEASE, S_COUNT };

/* conn.c: one statement with parameters on *cp by `deadline`; *out gets the
 * result (caller PQclear). A timeout or a broken link drops *cp. */
int dlock__pg_run(PGconn **cp, int64_t deadline, const char *what, const char *sql, int n, const char *const *vals,
		  PGresult **out);

/* Finish the command just sent on *cp (sent: what PQsend* returned) by
 * `deadline`, as dlock__pg_run does. */
int dlock__pg_finish(PGconn **cp, int64_t deadline, const char *what, int sent, PGresult **out);

/* Close *cp (after a cancel request when `cancel`), leaving NULL. */
void dlock__pg_drop_conn(PGconn **cp, int cancel);

/* Milliseconds to poll until deadline (>= 0, capped for int). */
int dlock__pg_poll_ms(int64_t deadline);

/* A new connection by `deadline` (TLS, keepalive, TCP_USER_TIMEOUT set). */
PGconn *dlock__pg_connect_db(postgres_store *be, int64_t deadline, int *code);

/* Is an idle connection still usable (no error, no pending input)? */
int dlock__pg_idle_ok(PGconn *c);

/* The store's main connection (under the store mutex), connected by `deadline`. */
int dlock__pg_main_conn(postgres_store *be, int64_t deadline, PGconn **out);

/* Take what the server sent so far: 1 complete (*last, *code), 0 more to
 * come, -1 connection failed. Never blocks. */
int dlock__pg_q_step(PGconn *c, const char *what, PGresult **last, int *code);

/* Run prepared statement `which` (S_*) on the main connection, preparing it first. */
int dlock__pg_run_stmt(postgres_store *be, int64_t deadline, int which, const char *what, const char *const *vals,
		       PGresult **out);

/* Create or check table mode's schema (schema.sql) once per store handle. */
int dlock__pg_ensure_schema(postgres_store *be, int64_t deadline);

/* The 64-bit advisory key of (ns, name, slot). */
int64_t dlock__pg_adv_key(const char *ns, const char *name, const char *slot);

/* notify.c: be->watch and be->unwatch (the LISTEN thread feeds the core's board). */
int dlock__pg_watch(dlock_backend *base, const dlock_request *req);

void dlock__pg_unwatch(dlock_backend *base, const dlock_request *req);

/* Decimal text of v into buf. */
void dlock__pg_i64s(char *buf, size_t n, int64_t v);

#endif
