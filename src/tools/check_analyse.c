/* check_analyse.c — the log of a `dlock check` run read back into holds, and
 * judged: overlaps, stale writes, lost updates, recovery after each fault.
 * Pure logic over the log (check.h); tests/unit/test_check_analyse.c. */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_grant(const void *x, const void *y)
{
	const hold *a = x, *b = y;
	return (a->t_grant > b->t_grant) - (a->t_grant < b->t_grant);
}

static hold *find_hold(results *r, int slot, int inc, long long seq)
{
	/* Recent holds are the likely match: search backwards. */
	for (size_t i = r->nholds; i-- > 0;)
		if (r->holds[i].slot == slot && r->holds[i].inc == inc && r->holds[i].seq == seq)
			return &r->holds[i];
	return NULL;
}

int check_read_log(const char *path, results *r)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t cap = 0;
	char line[512];
	while (fgets(line, sizeof line, f)) {
		char t;
		int slot, inc;
		long long seq, a, b;
		if (sscanf(line, "%c %d %d %lld %lld", &t, &slot, &inc, &seq, &a) != 5)
			continue;
		if (t == 'A') {
			unsigned long long fence;
			int kind = K_PLAIN;
			int na = sscanf(line, "A %*d %*d %*d %*d %lld %llu %d", &b, &fence, &kind);
			if (na < 2)
				continue;
			if (na < 3 || kind < 0 || kind >= K_NKINDS)
				kind = K_PLAIN;
			if (r->nholds == cap) {
				cap = cap ? cap * 2 : 256;
				hold *n = realloc(r->holds, cap * sizeof *n);
				if (!n) {
					fclose(f);
					return -1;
				}
				r->holds = n;
			}
			hold *h = &r->holds[r->nholds++];
			memset(h, 0, sizeof *h);
			h->slot = slot;
			h->inc = inc;
			h->seq = seq;
			h->t_req = a;
			h->t_grant = b;
			h->fence = fence;
			h->kind = kind;
			h->read_ok = h->write_ok = -2;
			h->t_lost = h->t_rel = h->t_read = h->t_write = h->t_died = -1;
			continue;
		}
		if (t == 'E') {
			r->errors++;
			continue;
		}
		hold *h = find_hold(r, slot, inc, seq);
		if (!h)
			continue;
		if (t == 'W') {
			char op;
			int ok;
			unsigned long long fence, hb;
			long long v;
			if (sscanf(line, "W %*d %*d %*d %*d %c %d %llu %lld %llu", &op, &ok, &fence, &v, &hb) != 5)
				continue;
			if (op == 'r') {
				h->t_read = a;
				h->read_ok = ok;
				h->read_val = v;
			} else {
				h->t_write = a;
				h->write_ok = ok;
				h->write_val = v;
				h->stale_write = ok == 1 && fence < hb;
			}
		} else if (t == 'L') {
			if (h->t_lost < 0)
				h->t_lost = a;
		} else if (t == 'X') {
			int rc = -1;
			if (sscanf(line, "X %*d %*d %*d %*d %d", &rc) == 1 && rc == 0)
				h->extended++;
		} else if (t == 'D') {
			/* a `dlock run` command seen dead after its tool was SIGKILLed */
			if (h->t_died < 0 || a < h->t_died)
				h->t_died = a;
		} else if (t == 'R') {
			int rc = 0;
			sscanf(line, "R %*d %*d %*d %*d %d", &rc);
			h->t_rel = a;
			h->rel_rc = rc;
			h->released = true;
		}
	}
	fclose(f);
	return 0;
}

static void not_run(results *r, const char *what, const char *why)
{
	size_t n = strlen(r->not_run_why);
	snprintf(r->not_run_why + n, sizeof r->not_run_why - n, "%s%s: %s", n ? "; " : "", what, why);
	r->not_run++;
}

const char *check_verdict(const results *r)
{
	bool violated = r->unexplained || r->nfence_bad || r->lost_updates || r->stale_writes || r->reg.stale_accepted;
	return violated ? "fail" : r->not_run ? "incomplete" : "pass";
}

void check_analyse(results *r, const check_opts *o)
{
	/* The end of what each holder believed: release, lost signal, or death. */
	for (size_t i = 0; i < r->nholds; i++) {
		hold *h = &r->holds[i];
		int64_t end = h->released ? h->t_rel : r->end_us;
		if (h->t_lost >= 0 && h->t_lost < end)
			end = h->t_lost;
		/* A `dlock run` command holds until it ends or is seen dead: a
		 * command that outlived its tool's SIGKILL still acts as holder. */
		if (h->kind == K_RUN && h->t_died >= 0 && h->t_died < end) {
			end = h->t_died;
			h->tool_killed = true;
		}
		if (h->kind >= 0 && h->kind < K_NKINDS)
			r->kinds[h->kind]++;
		for (size_t k = 0; k < r->nfaults; k++) {
			const fault *f = &r->faults[k];
			if (f->slot != h->slot || f->inc != h->inc)
				continue;
			if (f->kind == F_KILL && f->ok && !h->released && f->start_us >= h->t_grant &&
			    f->start_us < end) {
				end = f->start_us;
				h->killed = true;
			}
		}
		if (end < h->t_grant)
			end = h->t_grant;
		h->t_end = end;
		for (size_t k = 0; k < r->nfaults; k++) {
			const fault *f = &r->faults[k];
			if (f->kind == F_PAUSE && f->ok && f->slot == h->slot && f->inc == h->inc &&
			    f->start_us >= h->t_grant && f->start_us <= h->t_end)
				h->paused = true;
		}
	}
	if (r->nholds)
		qsort(r->holds, r->nholds, sizeof *r->holds, by_grant);

	size_t cap_o = 0, cap_f = 0;
	uint64_t max_fence = 0;
	size_t max_at = 0;
	for (size_t i = 0; i < r->nholds; i++) {
		hold *b = &r->holds[i];
		/* Every earlier grant whose believed interval reaches past our grant. */
		for (size_t j = 0; j < i; j++) {
			hold *a = &r->holds[j];
			if (a->t_end <= b->t_grant)
				continue;
			if (r->noverlaps == cap_o) {
				cap_o = cap_o ? cap_o * 2 : 64;
				pair *n = realloc(r->overlaps, cap_o * sizeof *n);
				if (!n)
					break;
				r->overlaps = n;
			}
			pair *p = &r->overlaps[r->noverlaps++];
			p->a = (int)j;
			p->b = (int)i;
			p->from_us = b->t_grant;
			p->to_us = a->t_end < b->t_end ? a->t_end : b->t_end;
			/* A paused holder's lease ran out while it was stopped: no lease can
			 * prevent that overlap; only the fence can make it harmless. */
			p->explained = a->paused;
			if (!p->explained)
				r->unexplained++;
			a->overlapped = b->overlapped = true;
		}
		if (i > 0 && b->fence <= max_fence) {
			if (r->nfence_bad == cap_f) {
				cap_f = cap_f ? cap_f * 2 : 16;
				pair *n = realloc(r->fence_bad, cap_f * sizeof *n);
				if (n)
					r->fence_bad = n;
			}
			if (r->nfence_bad < cap_f) {
				pair *p = &r->fence_bad[r->nfence_bad++];
				p->a = (int)max_at;
				p->b = (int)i;
				p->from_us = p->to_us = b->t_grant;
				p->explained = false;
			}
		}
		if (i == 0 || b->fence > max_fence) {
			max_fence = b->fence;
			max_at = i;
		}
		if (b->stale_write)
			r->stale_writes++;
	}
	r->lost_updates = r->reg.accepted - r->reg.value;

	r->worst_heal_us = 0;
	for (size_t k = 0; k < r->nfaults; k++) {
		fault *f = &r->faults[k];
		f->heal_to_grant_us = -1;
		for (size_t i = 0; i < r->nholds; i++) {
			if (r->holds[i].t_grant >= f->end_us) {
				f->heal_to_grant_us = r->holds[i].t_grant - f->end_us;
				break;
			}
		}
		if (f->heal_to_grant_us < 0 && f->ok)
			r->liveness_gap = true;
		/* How long the store stayed split: a bounded window (the holder learns
		 * of the fault at its next renewal) or for good (two worlds). */
		int64_t until = k + 1 < r->nfaults ? r->faults[k + 1].start_us : INT64_MAX;
		f->split_us = -1;
		for (size_t i = 0; i < r->noverlaps; i++) {
			const pair *p = &r->overlaps[i];
			if (!p->explained && p->from_us >= f->start_us && p->from_us < until &&
			    p->to_us - f->end_us > f->split_us)
				f->split_us = p->to_us - f->end_us;
		}
		if (f->heal_to_grant_us > r->worst_heal_us)
			r->worst_heal_us = f->heal_to_grant_us;
	}
	/* Every requested fault and op ran, or the run says which did not and why:
	 * never a silent skip, never a pass without it. */
	r->not_run = 0;
	r->not_run_why[0] = '\0';
	for (unsigned k = F_PAUSE; o && k <= F_LAST; k <<= 1) {
		if (!(o->faults & k))
			continue;
		const char *why = NULL;
		bool ran = false;
		for (size_t i = 0; i < r->nfaults && !ran; i++) {
			if (r->faults[i].kind != k)
				continue;
			ran = r->faults[i].ok;
			why = r->faults[i].note[0] ? r->faults[i].note : "failed";
		}
		if (!ran)
			not_run(r, check_fault_name(k),
				why ? why
				    : "never scheduled: the run fell behind its schedule and had no room left for it (a "
				      "fault needs its length + 2 x ttl + hold before the end)");
	}
	if (o && (o->ops & OP_EXTEND) && r->delayed == 0)
		not_run(r, "extend",
			r->kinds[K_EXTEND] ? "no renewal could be delayed (the fault proxy or the sqlite3 shell "
					     "refused)"
					   : "no extended hold in the run");
	if (o && (o->ops & OP_HANDLE) && r->kinds[K_HANDLE] == 0)
		not_run(r, "handle", "no hold through a handle in the run");
	r->pass = r->unexplained == 0 && r->nfence_bad == 0 && r->lost_updates == 0 && r->stale_writes == 0 &&
		  r->reg.stale_accepted == 0 && r->not_run == 0;
}
