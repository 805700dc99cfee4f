/*
 * parse.h — the pure name handling of the ZooKeeper store
 * (src/stores/zookeeper/parse.c), exposed only so the libFuzzer target
 * tests/fuzz/fuzz_zookeeper.c can feed it hostile input. Internal: not
 * installed, not part of the API.
 */
#ifndef DLOCK_STORES_ZOOKEEPER_PARSE_H
#define DLOCK_STORES_ZOOKEEPER_PARSE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { K_LOCK, K_READ, K_SEM } node_kind;

/* A sequential child node as parsed from its name (name points into the input). */
typedef struct child {
	const char *name;
	int64_t seq;
	node_kind kind;
	unsigned permits; /* K_SEM: the semaphore size its name carries ("-sem3-"); 0: not said */
} child;

/* One znode name component for lock name s: reversible percent-encoding of
 * everything but [A-Za-z0-9._-]; an all-dots name is fully encoded ("." and
 * ".." are not valid znode names). malloc'd; NULL (error set) on OOM. */
char *dlock__zk_escape(const char *s);
/* The lock name an escaped component stands for; NULL if s is not a valid
 * escape (a '%' not followed by two hex digits) or on OOM. */
char *dlock__zk_unescape(const char *s);
/* Parse "<anything>-<kind>-<10 digits>" (also Curator's and kazoo's names);
 * false when name does not end in 10 digits. */
bool dlock__zk_parse_child(const char *name, child *c);

#endif
