/*
 * dlock check's judge (src/tools/check_analyse.c) on logs written here: what
 * it must call an overlap, what a pause or the lost signal or a kill
 * explains, fences that go back, stale writes, lost updates, and recovery
 * after each fault. Times are microseconds of run time.
 */
#include "testutil/testutil.h"

#include "check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/dlock-test-check-XXXXXX";

/* The names live in check.c (options); the judge needs them only for its
 * not-run reasons. */
const char *check_fault_name(unsigned k)
{
	return k == F_KILLTOOL ? "kill-tool" : k == F_EVICT ? "evict" : "other";
}

const char *check_kind_name(int k)
{
	return k == K_RUN ? "run" : "plain";
}

/* judge() with the options of a run that asked for `faults` and `ops`. */
static check_opts want;

/* Judge the log `text` (with `nfaults` faults, a register that accepted
 * `accepted` writes and holds `value`) into *r; 0, or -1 if unreadable. */
static int judge(results *r, const char *text, const fault *faults, size_t nfaults, int64_t accepted, int64_t value,
		 int64_t end_us)
{
	char path[64];
	snprintf(path, sizeof path, "%s/log", dir);
	FILE *f = fopen(path, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0)
		return -1;
	memset(r, 0, sizeof *r);
	r->faults = calloc(nfaults ? nfaults : 1, sizeof *r->faults);
	if (!r->faults)
		return -1;
	if (nfaults)
		memcpy(r->faults, faults, nfaults * sizeof *faults);
	r->nfaults = nfaults;
	r->reg.accepted = accepted;
	r->reg.value = value;
	r->end_us = end_us;
	int rc = check_read_log(path, r);
	check_opts o = { .clients = 2, .fencing = true, .faults = want.faults, .ops = want.ops };
	if (rc == 0)
		check_analyse(r, &o);
	return rc;
}

static void done(results *r)
{
	free(r->holds);
	free(r->overlaps);
	free(r->fence_bad);
	free(r->faults);
}

static fault a_fault(unsigned kind, int slot, int64_t start, int64_t end)
{
	fault f = { .kind = kind, .slot = slot, .inc = 0, .member = -1, .start_us = start, .end_us = end, .ok = 1 };
	return f;
}

int main(void)
{
	CHECK(mkdtemp(dir) != NULL);
	results r;

	/* Two holds one after the other, each writing once: a pass. */
	CHECK_RC(judge(&r,
		       "A 0 0 1 90 100 1\n"
		       "W 0 0 1 110 r 1 1 0 0\n"
		       "W 0 0 1 120 w 1 1 1 1\n"
		       "R 0 0 1 150 0\n"
		       "A 1 0 1 140 160 2\n"
		       "W 1 0 1 170 r 1 2 1 1\n"
		       "W 1 0 1 180 w 1 2 2 2\n"
		       "R 1 0 1 200 0\n",
		       NULL, 0, 2, 2, 1000),
		 0);
	CHECK(r.nholds == 2 && r.noverlaps == 0 && r.unexplained == 0 && r.nfence_bad == 0);
	CHECK(r.holds[0].write_ok == 1 && r.holds[1].read_val == 1 && r.holds[1].t_rel == 200);
	CHECK(r.lost_updates == 0 && r.stale_writes == 0 && r.pass);
	done(&r);

	/* The second grant before the first release: an overlap nothing explains. */
	CHECK_RC(judge(&r, "A 0 0 1 90 100 1\nR 0 0 1 300 0\nA 1 0 1 150 200 2\nR 1 0 1 400 0\n", NULL, 0, 0, 0, 1000),
		 0);
	CHECK(r.noverlaps == 1 && r.unexplained == 1 && !r.pass);
	CHECK(r.overlaps[0].from_us == 200 && r.overlaps[0].to_us == 300 && !r.overlaps[0].explained);
	CHECK(r.holds[r.overlaps[0].a].slot == 0 && r.holds[r.overlaps[0].b].slot == 1);
	done(&r);

	/* The same, with the first holder stopped (pause) while it held: explained;
	 * the verdict rests on the fences and the register. */
	fault pause = a_fault(F_PAUSE, 0, 120, 260);
	CHECK_RC(judge(&r, "A 0 0 1 90 100 1\nR 0 0 1 300 0\nA 1 0 1 150 200 2\nR 1 0 1 400 0\n", &pause, 1, 0, 0,
		       1000),
		 0);
	CHECK(r.noverlaps == 1 && r.unexplained == 0 && r.overlaps[0].explained && r.holds[0].paused && r.pass);
	CHECK(r.faults[0].heal_to_grant_us == -1 && r.liveness_gap); /* no grant after 260 */
	done(&r);

	/* The lost signal ends what the first holder believed: no overlap. */
	CHECK_RC(judge(&r, "A 0 0 1 90 100 1\nL 0 0 1 180\nR 0 0 1 300 -6\nA 1 0 1 150 200 2\n", NULL, 0, 0, 0, 1000),
		 0);
	CHECK(r.noverlaps == 0 && r.holds[0].t_end == 180 && r.holds[0].rel_rc == -6 && r.pass);
	done(&r);

	/* A holder killed at 150 believed nothing after it; one never released
	 * believes until the end of the run. A kill aimed at another worker's
	 * incarnation changes nothing. */
	fault kill = a_fault(F_KILL, 0, 150, 150);
	CHECK_RC(judge(&r, "A 0 0 1 90 100 1\nA 1 0 1 150 200 2\n", &kill, 1, 0, 0, 1000), 0);
	CHECK(r.noverlaps == 0 && r.holds[0].killed && r.holds[0].t_end == 150 && r.holds[1].t_end == 1000);
	CHECK(r.faults[0].heal_to_grant_us == 50 && r.worst_heal_us == 50 && !r.liveness_gap);
	done(&r);
	kill.inc = 1;
	CHECK_RC(judge(&r, "A 0 0 1 90 100 1\nA 1 0 1 150 200 2\n", &kill, 1, 0, 0, 1000), 0);
	CHECK(r.noverlaps == 1 && r.unexplained == 1 && !r.holds[0].killed && !r.pass);
	done(&r);

	/* A fence that does not rise from one grant to the next. */
	CHECK_RC(judge(&r, "A 0 0 1 90 100 5\nR 0 0 1 150 0\nA 1 0 1 150 200 5\nR 1 0 1 250 0\n", NULL, 0, 0, 0, 1000),
		 0);
	CHECK(r.noverlaps == 0 && r.nfence_bad == 1 && r.fence_bad[0].b == 1 && !r.pass);
	done(&r);

	/* A write accepted with fence 1 after fence 2 was seen, and a register
	 * that holds less than it accepted (a lost update). */
	CHECK_RC(judge(&r, "A 0 0 1 90 100 1\nW 0 0 1 120 w 1 1 1 2\nR 0 0 1 150 0\n", NULL, 0, 3, 2, 1000), 0);
	CHECK(r.stale_writes == 1 && r.holds[0].stale_write && r.lost_updates == 1 && !r.pass);
	done(&r);

	/* Errors are counted; lines it cannot read, and events of holds it never
	 * saw granted, are skipped. */
	CHECK_RC(judge(&r, "E 0 0 1 100 -7 timed out\ngarbage\nA 0 0 x\nR 3 0 9 100 0\nA 0 0 1 90 100 1\n", NULL, 0, 0,
		       0, 1000),
		 0);
	CHECK(r.errors == 1 && r.nholds == 1 && r.pass);
	done(&r);

	/* Holds come out in grant order whatever order the workers logged them. */
	CHECK_RC(judge(&r, "A 1 0 1 250 300 2\nR 1 0 1 350 0\nA 0 0 1 90 100 1\nR 0 0 1 200 0\n", NULL, 0, 0, 0, 1000),
		 0);
	CHECK(r.nholds == 2 && r.holds[0].t_grant == 100 && r.holds[1].t_grant == 300 && r.nfence_bad == 0);
	done(&r);

	/* A `dlock run` command (kind 3) whose tool was SIGKILLed at 150 ran on
	 * until it was seen dead at 400: another worker granted at 300 overlaps
	 * it; a command that ended on its own (R) before its D line does not. */
	want.faults = F_KILLTOOL;
	fault kt = a_fault(F_KILLTOOL, 0, 150, 400);
	kt.count = 1;
	CHECK_RC(judge(&r,
		       "A 0 0 1 100 100 1 3\n"
		       "D 0 0 1 400\n"
		       "A 1 0 1 120 300 2\n"
		       "R 1 0 1 350 0\n"
		       "A 1 0 2 360 410 3 3\n"
		       "R 1 0 2 500 0\n"
		       "D 1 0 2 510\n"
		       "A 0 1 1 505 520 4\n"
		       "R 0 1 1 600 0\n",
		       &kt, 1, 0, 0, 1000),
		 0);
	CHECK(r.nholds == 4 && r.kinds[K_RUN] == 2 && r.kinds[K_PLAIN] == 2);
	CHECK(r.holds[0].t_end == 400 && r.holds[0].tool_killed && r.holds[2].t_end == 500 && !r.holds[2].tool_killed);
	CHECK(r.noverlaps == 1 && r.unexplained == 1 && r.overlaps[0].from_us == 300 && r.overlaps[0].to_us == 350);
	CHECK(r.not_run == 0 && !r.pass && strcmp(check_verdict(&r), "fail") == 0);
	done(&r);

	/* Requested faults that never ran: one failed (its note is the reason),
	 * one never scheduled; an op that never ran: the verdict is incomplete,
	 * never pass, though nothing was violated. Extends are counted per hold. */
	want.faults = F_KILLTOOL | F_EVICT;
	want.ops = OP_HANDLE;
	fault failed = a_fault(F_KILLTOOL, -1, 150, 150);
	failed.ok = 0;
	snprintf(failed.note, sizeof failed.note, "no `dlock run` command running to aim at");
	CHECK_RC(judge(&r, "A 0 0 1 90 100 1 1\nX 0 0 1 150 0 1\nX 0 0 1 160 -3 0\nR 0 0 1 200 0\n", &failed, 1, 0, 0,
		       1000),
		 0);
	CHECK(r.holds[0].extended == 1 && r.holds[0].kind == K_EXTEND && r.kinds[K_EXTEND] == 1);
	CHECK(r.not_run == 3 && !r.pass && strcmp(check_verdict(&r), "incomplete") == 0);
	CHECK(strstr(r.not_run_why, "kill-tool: no `dlock run` command running to aim at") != NULL);
	CHECK(strstr(r.not_run_why, "evict: never scheduled") != NULL);
	CHECK(strstr(r.not_run_why, "handle: no hold through a handle") != NULL);
	done(&r);
	memset(&want, 0, sizeof want);

	char path[64];
	snprintf(path, sizeof path, "%s/log", dir);
	unlink(path);
	rmdir(dir);
	return tu_done("check_analyse");
}
