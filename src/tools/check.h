/*
 * check.h — what the files of `dlock check` share. check.c: options and the
 * run; check_worker.c: the workers; check_register.c: the register they
 * write through; check_faults.c: the faults, the fault proxy and the server
 * processes; check_analyse.c: the log read back and judged (pure logic,
 * tests/unit/test_check_analyse.c runs it on logs of its own);
 * check_output.c: text, JSON and the HTML report's body (check_report.c its
 * frame).
 */
#ifndef DLOCK_CLI_CHECK_H
#define DLOCK_CLI_CHECK_H

#include "cli.h"

#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define FAULTPROXY_MAX_HOSTS 16
#define MAX_CLIENTS 64
#define MAX_FAULTS 256
#define MAX_SHOWN 20 /* violations printed one by one (all are counted) */

/* SIGINT/SIGTERM/SIGHUP reached the parent (check.c sets it). */
extern volatile sig_atomic_t check_interrupted;

/* ---- options ---------------------------------------------------------- */

/* clang-format off */
enum {
	F_PAUSE = 1, F_KILL = 2, F_RESTART = 4, F_MEMBER = 8, F_PARTITION = 16, F_LOSE = 32, F_DELAY = 64,
	F_SPAUSE = 128, F_FDELETE = 256, F_MRESTART = 512, F_FAILOVER = 1024,
	F_KILLTOOL = 2048, F_SESSKILL = 4096, F_EVICT = 8192, F_FAILBACK = 16384,
	F_LAST = F_FAILBACK,
	F_NET = F_PARTITION | F_LOSE | F_DELAY,              /* through the proxy */
	F_SERVER = F_RESTART | F_MEMBER | F_SPAUSE | F_MRESTART | F_FAILOVER, /* need the server script */
};
/* clang-format on */

/* --ops: what kinds of holds the workers take besides the plain one. */
enum {
	OP_EXTEND = 1, /* a renewed hold extended (dlock_extend) while its renewal is delayed */
	OP_HANDLE = 2, /* a no_renew hold kept by the holder's own extends (acquire/release handles) */
	OP_RUN = 4,    /* the hold of a `dlock run` child (kill-tool adds it) */
};

/* How a hold was taken (the log's hold kinds; check_analyse counts them). */
enum { K_PLAIN = 0, K_EXTEND = 1, K_HANDLE = 2, K_RUN = 3, K_NKINDS };

typedef struct check_opts {
	unsigned int clients;
	int64_t duration_ms, ttl_ms, hold_ms, every_ms, pause_ms, delay_ms;
	unsigned faults;
	unsigned ops;
	bool fencing;
	uint64_t seed;
	bool seed_set;
	const char *name, *server_script, *server_dir, *report, *work_dir;
	const char *replica, *master; /* failback: HOST:PORT of the replica and of the master */
	const cli_global *g;
} check_opts;

/* ---- state shared between the parent and the workers ------------------- */

typedef struct shared_state {
	atomic_int stop;
	atomic_llong holding[MAX_CLIENTS]; /* seq of the hold a worker is in, 0 when none */
	atomic_int reopen[MAX_CLIENTS];    /* file-delete: open the store again before the next try */
	atomic_int tool[MAX_CLIENTS];      /* pid of the worker's `dlock run`, 0 when none */
	atomic_llong delayed;              /* renewals delayed for an extend (ops extend) */
	atomic_llong extends;              /* extends that returned 0 */
} shared_state;

typedef struct run_ctx {
	check_opts *o;
	const char *uri;     /* what workers open; NULL = default store */
	char *worker_uri[MAX_CLIENTS]; /* through the proxy (network faults), else NULL */
	struct proxy *px;    /* the fault proxy, or NULL */
	char *db_path;       /* the SQLite file (file-delete, ops extend), or NULL */
	char *self;          /* this program (kill-tool runs `SELF run`) */
	bool failed_over;    /* failover happens once: the script restarts no master */
	int log_fd;
	char reg_path[PATH_MAX];
	shared_state *sh;
	int64_t deadline_us;
} run_ctx;

/* The register file: fixed-size binary record, read and written under flock. */
typedef struct reg_state {
	int64_t value;
	uint64_t highest;          /* highest fence seen (on any access) */
	int64_t accepted, rejected;
	int64_t stale_accepted;    /* writes accepted although a higher fence had been seen */
} reg_state;

/* ---- faults --------------------------------------------------------------- */

/* clang-format off */
typedef struct fault {
	unsigned kind;
	int slot, inc;          /* target worker, -1 for none or every worker */
	int member;             /* member index (member), -1 otherwise */
	int64_t start_us, end_us;
	int64_t heal_to_grant_us; /* -1: no grant after it */
	int64_t split_us;       /* fault end -> end of the last store-at-fault overlap that began
				 * between its start and the next fault's; -1: none */
	long long dropped;      /* bytes the proxy discarded (partition, lose-reply), -1 n/a */
	long long count;        /* what it did, counted (sessions killed, keys evicted, ...), -1 n/a */
	int ok;                 /* the fault was carried out */
	char note[200];
} fault;
/* clang-format on */

typedef struct proxy {
	pid_t pid;
	int ctl;
	int nhosts;  /* routes per worker: route of worker w, host h = w * nhosts + h */
	int nroutes;
	char dir[PATH_MAX], sock[108];
} proxy;

/* ---- the log, read back ---------------------------------------------------- */

typedef struct hold {
	int slot, inc;
	long long seq;
	int64_t t_req, t_grant, t_read, t_write, t_rel, t_lost, t_end;
	int64_t t_died;         /* a `dlock run` command: when it was seen dead (kill-tool), -1 */
	int kind;               /* K_PLAIN, K_EXTEND, ... */
	int extended;           /* extends that returned 0 during the hold */
	uint64_t fence;
	int read_ok, write_ok;  /* 1 accepted, 0 refused, -1 error, -2 not tried */
	int64_t read_val, write_val;
	bool stale_write;       /* accepted although a higher fence had been seen */
	int rel_rc;
	bool released, killed, paused, tool_killed;
	bool overlapped;
} hold;

typedef struct pair {
	int a, b; /* indexes into holds, a granted first */
	int64_t from_us, to_us;
	bool explained;
} pair;

typedef struct results {
	hold *holds;
	size_t nholds;
	pair *overlaps;
	size_t noverlaps, unexplained;
	pair *fence_bad;
	size_t nfence_bad;
	size_t stale_writes;    /* from the log */
	size_t errors;
	reg_state reg;
	int64_t lost_updates;
	int64_t end_us;
	size_t nfaults;
	fault *faults;
	int64_t worst_heal_us;
	size_t stuck;           /* workers still in a call ttl+hold+10s after the end: killed */
	bool liveness_gap;      /* a fault was followed by no grant at all */
	size_t kinds[K_NKINDS]; /* holds of each kind */
	long long extends, delayed; /* from the workers: extends done, renewals delayed */
	unsigned not_run;       /* requested fault kinds never carried out */
	char not_run_why[400];  /* why, per kind */
	bool pass;
} results;

/* check.c: time (microseconds; run time counts from the start), randomness. */
extern int64_t check_t0_us; /* the run's origin on CLOCK_MONOTONIC */

int64_t check_mono_us(void);

int64_t check_now_us(void);

/* Sleep until run time `at_us`; an absolute deadline, so a SIGSTOP in the middle
 * does not stretch it: the sleeper wakes at once after SIGCONT if it is late. */
void check_sleep_until(int64_t at_us);

void check_sleep_ms(int64_t ms);

/* The parent's sleeps during a fault: cut short by SIGINT/SIGTERM, so that a
 * stopped worker is never left behind. */
void check_fault_sleep_ms(int64_t ms);

uint64_t check_rnd_below(uint64_t *s, uint64_t n);

/* check_register.c */
/*
 * One access to the register. write=false: read (value into *value);
 * write=true: store *value. Returns 1 accepted, 0 refused (stale fence),
 * -1 on an I/O error. *highest_before gets the highest fence seen before.
 */
int check_reg_access(const char *path, bool fencing, bool write_op, uint64_t fence, int64_t *value,
		     uint64_t *highest_before);

/* check_worker.c: fork a worker (slot, incarnation). */
pid_t check_spawn_worker(const run_ctx *c, int slot, int inc);

/* check.c: a fault kind's option name; a hold kind's name. */
const char *check_fault_name(unsigned k);

const char *check_kind_name(int k);

/* check_worker.c: `dlock check` started as a `dlock run` command by a worker
 * (DLOCK_CHECK_COMMAND in the environment): log the grant, ignore SIGTERM,
 * hold, write, log the end. Returns the exit code. */
int check_as_command(const char *spec);

/* check_faults.c: the new faults' own checks before the run (0, or a usage
 * error already printed). */
int check_seam_prepare(run_ctx *c, const char *shown);

/* check_faults.c */
/* Members for the `member` fault: DIR/members (ZooKeeper, etcd) or DIR/<i>/ (Redis). */
int check_count_members(const char *dir, bool *members_file);

void check_proxy_stop(proxy *p);

/*
 * Start the proxy with one route per worker and host of `uri` and fill
 * c->worker_uri[]. Returns 0, or -1 with a message in err.
 */
int check_proxy_start(proxy *p, run_ctx *c, char *err, size_t errlen);

/* Whether the server script offers the command WORD: a `WORD)` case, or
 * WORD in the a|b|c list of its usage comment (redlock.sh hands its commands
 * on to redis.sh). */
bool check_script_offers(const char *script, const char *word);

/*
 * The processes of the servers started in `dir`, read the way the scripts of
 * tests/servers/ keep them: DIR/members (ZooKeeper, etcd), DIR/<i>/redis.pid
 * (Redis, Redlock), DIR/m/redis.pid (the Sentinel setup's master),
 * DIR/memcached.pid, DIR/pid (MariaDB), the postmaster of DIR/data or of the
 * cluster named in DIR/pgroot (PostgreSQL), and every descendant of those
 * (PostgreSQL's backends): a stopped postmaster alone would leave the
 * connections served.
 */
int check_server_pids(const char *dir, pid_t *pids, int max);

/* The SQLite database file of the store: from its URI, or the default one. */
char *check_sqlite_path(const char *uri);

/* check_analyse.c: read the run's log into r (0, or -1), then judge it. */
int check_read_log(const char *path, results *r);

void check_analyse(results *r, const check_opts *o);

/* "pass", "fail" (a safety property violated) or "incomplete" (none
 * violated, but a requested fault or op never ran: r->not_run_why says why). */
const char *check_verdict(const results *r);

/* check_output.c */
double check_us_to_ms(int64_t us);

void check_print_text(const check_opts *o, const char *shown, const results *r);

/* The run as one JSON object; `full` adds every hold (for the report). */
void check_print_json(FILE *f, const check_opts *o, const char *shown, const results *r, bool full);

/* The body: summary, verdict table, violation lines, static SVG timeline
 * (wider for longer runs, in a box that scrolls), faults table. */
void check_write_report(FILE *f, const check_opts *o, const char *shown, const results *r);

/* check_faults.c: the run's own steps. */
/* Collect exited workers; one that failed on its own (store down during a
 * restart) is replaced, a bounded number of times so a dead store cannot make
 * us fork in a loop. */
void check_reap(run_ctx *c, pid_t *pids, int *incs, bool respawn);

/* Carry out one fault; fills f. */
void check_do_fault(run_ctx *c, unsigned kind, uint64_t *rs, pid_t *pids, int *incs, fault *f);

#endif
