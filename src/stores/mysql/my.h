/*
 * What the files of the MySQL/MariaDB store share (mysql://…?mode=table|get_lock):
 * the store handle, SQL text, errors and connections bounded by the caller's
 * deadline, the schema (conn.c, schema.sql); table mode (table.c); GET_LOCK
 * mode (get_lock.c); status and list of both (status.c); open/close: mysql.c.
 * docs/stores/mysql.md has the guarantees and the failure model.
 */
#ifndef DLOCK_STORES_MYSQL_MY_H
#define DLOCK_STORES_MYSQL_MY_H

#include "../support.h"

#include <mysql.h>
#include <mysqld_error.h>
#include <errmsg.h>

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define KIND "mysql"
#define SCHEMA_VERSION 1
#define POOL_MAX 4
#define RENEW_CHUNK 200
/* GET_LOCK names: MySQL 5.7+ refuses names over 64 characters. */
#define KEY_MAX_CHARS 64

enum { MODE_TABLE, MODE_GET_LOCK };

/* One GET_LOCK hold: its own connection (req->slot). */
typedef struct gl_hold {
	struct gl_hold *next;
	MYSQL *conn;           /* NULL once the connection failed: the lock is gone */
	unsigned long conn_id; /* CONNECTION_ID() of conn */
	int waited;            /* taken by g_wait; g_acquire completes the grant */
	char key_hex[2 * 4 * KEY_MAX_CHARS + 1];
} gl_hold;

typedef struct mysql_store {
	dlock_backend base;
	int mode;
	char *host, *user, *password, *db, *socket;
	int port;
	unsigned int timeout_s;     /* connect timeout, whole seconds (keepalive, backstop timers) */
	unsigned int lock_wait_s;   /* innodb_lock_wait_timeout: under one request's bound */
	int64_t connect_timeout_ms; /* bound of the whole open */
	int64_t request_timeout_ms; /* bound of status */
	char *ssl_ca, *ssl_capath, *ssl_cert, *ssl_key;
	int ssl_enforce, ssl_verify;
	char *ns_hex; /* X'..' literal of the prefix */
	MYSQL *conn;  /* table ops, status, schema */
	MYSQL *pool[POOL_MAX];
	size_t npool;
	gl_hold *holds;
	/* g_wait runs without the store mutex: its connections have their own. */
	pthread_mutex_t wait_mu;
	MYSQL *wait_pool[POOL_MAX];
	size_t nwait_pool;
} mysql_store;

/* ---- what the files of this store share ---- */

/* The store's SQL text: support.h's growable string. */
typedef dlock_sys_sbuf sbuf;
#define sb_add dlock_sys_sb_add

/* The method tables: table.c (mode=table), get_lock.c (mode=get_lock; with
 * waits on the server where GET_LOCK takes fractional timeouts). */
extern const dlock_backend_methods dlock__my_table_methods;
extern const dlock_backend_methods dlock__my_get_lock_methods;
extern const dlock_backend_methods dlock__my_get_lock_wait_methods;
void dlock__my_be_close(dlock_backend *be);

void dlock__my_sb_hex(sbuf *s, const char *bytes);

int dlock__my_sb_check(sbuf *s);

long long dlock__my_us(int64_t ms);

int dlock__my_is_conn_error(unsigned int e);

int dlock__my_run(mysql_store *b, sbuf *sql, MYSQL_RES **out, const char *what, int txn, int64_t deadline);

extern _Thread_local int dlock__my_tl_timed_out;

int dlock__my_timed_out(MYSQL *c, const char *what);

int dlock__my_read_all(mysql_store *b, MYSQL *c, MYSQL_RES **out, const char *what, int64_t deadline);

extern _Thread_local int dlock__my_tl_want_partial;

extern _Thread_local MYSQL_RES *dlock__my_tl_partial;

int dlock__my_conn_dead(MYSQL *c);

int dlock__my_nb_send(MYSQL *c, const char *sql, size_t len, int64_t deadline);

int dlock__my_nb_read_result(MYSQL *c, int64_t deadline);

int dlock__my_exec(mysql_store *b, MYSQL *c, const char *sql, size_t len, MYSQL_RES **out, const char *what,
		   int64_t deadline);

int dlock__my_conn_open(mysql_store *b, MYSQL **out, int64_t deadline);

void dlock__my_conn_drop(MYSQL **c);

int dlock__my_schema_ensure(mysql_store *b, int64_t deadline);

int64_t dlock__my_row_i64(MYSQL_ROW row, int i, int64_t dflt);

uint64_t dlock__my_row_u64(MYSQL_ROW row, int i);

void dlock__my_where_name(sbuf *s, const mysql_store *b, const char *name);

int dlock__my_too_late(const dlock_request *req);

int dlock__my_refused_before_timeout(const char *flag);

void dlock__my_sb_key(sbuf *s, const mysql_store *b, const char *name_sql);

void dlock__my_hold_free(mysql_store *b, gl_hold *h, int reuse);

int dlock__my_be_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
			size_t *count);

int dlock__my_be_list(dlock_backend *be, char ***names, size_t *count);

#endif
