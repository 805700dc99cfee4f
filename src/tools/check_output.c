/* check_output.c — the results of `dlock check` as text, as JSON, and as the
 * body of the HTML report (check_report.c writes its frame) (check.h). */
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>

/* ---- output --------------------------------------------------------------- */

double check_us_to_ms(int64_t us)
{
	return (double)us / 1000.0;
}

static void hold_text(char *buf, size_t len, const hold *h)
{
	char kind[48] = "";
	if (h->kind != K_PLAIN)
		snprintf(kind, sizeof kind, ", %s%s", check_kind_name(h->kind), h->extended ? " extended" : "");
	snprintf(buf, len, "worker %d hold %lld (fence %" PRIu64 ", %.1f-%.1f ms%s%s%s)", h->slot, h->seq, h->fence,
		 check_us_to_ms(h->t_grant), check_us_to_ms(h->t_end), kind, h->paused ? ", paused" : "",
		 h->killed                                 ? ", killed"
		 : h->tool_killed                          ? ", its dlock run killed"
		 : h->t_lost >= 0 && h->t_lost <= h->t_end ? ", lost"
							   : "");
}

/* The overlaps, real (excused false: "OVERLAP") or excused by a pause, one
 * line each (at most MAX_SHOWN). */
static void overlap_lines(const results *r, bool excused, void (*emit)(void *ctx, const char *line), void *ctx)
{
	char a[160], b[160], line[512];
	size_t shown_n = 0;
	for (size_t i = 0; i < r->noverlaps && shown_n < MAX_SHOWN; i++) {
		const pair *p = &r->overlaps[i];
		if (p->explained != excused)
			continue;
		hold_text(a, sizeof a, &r->holds[p->a]);
		hold_text(b, sizeof b, &r->holds[p->b]);
		snprintf(line, sizeof line, "%s: %s and %s overlap for %.1f ms",
			 excused ? "overlap after pause" : "OVERLAP", a, b, check_us_to_ms(p->to_us - p->from_us));
		emit(ctx, line);
		shown_n++;
	}
}

/* The violations one by one (at most MAX_SHOWN of each kind; all are
 * counted), one line each: for the terminal and for the report. Only the
 * real ones: the overlaps a pause excuses come in a section of their own,
 * after them (excused_lines), so that they never push a real one out of
 * sight. */
static void violation_lines(const results *r, void (*emit)(void *ctx, const char *line), void *ctx)
{
	char a[160], b[160], line[512];
	size_t shown_n;
	overlap_lines(r, false, emit, ctx);
	for (size_t i = 0; i < r->nfence_bad && i < MAX_SHOWN; i++) {
		hold_text(a, sizeof a, &r->holds[r->fence_bad[i].a]);
		hold_text(b, sizeof b, &r->holds[r->fence_bad[i].b]);
		snprintf(line, sizeof line, "FENCE ORDER: %s was granted after %s with a fence not greater", b, a);
		emit(ctx, line);
	}
	shown_n = 0;
	for (size_t i = 0; i < r->nholds && shown_n < MAX_SHOWN; i++) {
		if (!r->holds[i].stale_write)
			continue;
		hold_text(a, sizeof a, &r->holds[i]);
		snprintf(line, sizeof line, "STALE WRITE: %s wrote %lld at %.1f ms after a higher fence had been used",
			 a, (long long)r->holds[i].write_val, check_us_to_ms(r->holds[i].t_write));
		emit(ctx, line);
		shown_n++;
	}
	if (r->lost_updates) {
		snprintf(line, sizeof line, "LOST UPDATES: %lld writes were accepted but the register holds %lld",
			 (long long)r->reg.accepted, (long long)r->reg.value);
		emit(ctx, line);
	}
	if (r->not_run) {
		snprintf(line, sizeof line, "NOT RUN: %.480s", r->not_run_why);
		emit(ctx, line);
	}
}

static bool any_violation(const results *r)
{
	return r->unexplained || r->nfence_bad || r->stale_writes || r->lost_updates || r->not_run;
}

/* The heading of the excused overlaps: why they are not violations. */
static const char *excused_why(const check_opts *o)
{
	return o->fencing ? "the lease ran out while its holder was stopped by a pause fault: no lease can "
			    "prevent that, only fencing makes it harmless (fencing is on: its late accesses "
			    "were refused)"
			  : "the lease ran out while its holder was stopped by a pause fault: no lease can "
			    "prevent that, only fencing makes it harmless (fencing is off: expected here; what "
			    "the late holder broke is listed above as stale writes and lost updates)";
}

/* The overlaps a pause excuses, one line each (at most MAX_SHOWN). */
static void excused_lines(const results *r, void (*emit)(void *ctx, const char *line), void *ctx)
{
	overlap_lines(r, true, emit, ctx);
}

/* Per requested fault kind: how many were carried out and how many failed. */
static void kind_counts(const results *r, unsigned k, size_t *done, size_t *failed)
{
	*done = *failed = 0;
	for (size_t i = 0; i < r->nfaults; i++)
		if (r->faults[i].kind == k) {
			if (r->faults[i].ok)
				(*done)++;
			else
				(*failed)++;
		}
}

static void print_line(void *ctx, const char *line)
{
	(void)ctx;
	printf("  %s\n", line);
}

void check_print_text(const check_opts *o, const char *shown, const results *r)
{
	size_t reads_refused = 0;
	for (size_t i = 0; i < r->nholds; i++)
		reads_refused += r->holds[i].read_ok == 0;
	printf("dlock check: store %s, %u clients, %.1fs, ttl %.0fms, hold %.0fms, fencing %s, seed %" PRIu64 "\n",
	       shown, o->clients, check_us_to_ms(r->end_us) / 1000.0, (double)o->ttl_ms, (double)o->hold_ms,
	       o->fencing ? "on" : "off", o->seed);
	if (o->ops)
		printf("  holds: plain %zu, extend %zu, handle %zu, dlock run %zu; extends %lld, renewals delayed %lld\n",
		       r->kinds[K_PLAIN], r->kinds[K_EXTEND], r->kinds[K_HANDLE], r->kinds[K_RUN], r->extends,
		       r->delayed);
	printf("  grants %zu, writes accepted %lld, refused %lld (reads refused %zu), errors %zu, faults %zu\n",
	       r->nholds, (long long)r->reg.accepted, (long long)r->reg.rejected, reads_refused, r->errors, r->nfaults);
	if (o->faults) {
		printf("  faults injected by kind:");
		const char *sep = " ";
		for (unsigned k = F_PAUSE; k <= F_LAST; k <<= 1) {
			if (!(o->faults & k))
				continue;
			size_t done, failed;
			kind_counts(r, k, &done, &failed);
			printf("%s%s %zu", sep, check_fault_name(k), done);
			if (failed)
				printf(" (%zu failed)", failed);
			sep = ", ";
		}
		printf("\n");
	}
	for (size_t k = 0; k < r->nfaults; k++) {
		const fault *f = &r->faults[k];
		char heal[96] = "no grant after it";
		if (f->heal_to_grant_us >= 0)
			snprintf(heal, sizeof heal, "next grant %.0fms later", check_us_to_ms(f->heal_to_grant_us));
		if (f->split_us >= 0)
			snprintf(heal + strlen(heal), sizeof heal - strlen(heal), ", OVERLAPS until %.0fms after",
				 check_us_to_ms(f->split_us));
		char target[32] = "server";
		if (f->slot >= 0)
			snprintf(target, sizeof target, "worker %d", f->slot);
		else if (f->member >= 0)
			snprintf(target, sizeof target, "member %d", f->member);
		if (f->slot < 0 && (f->kind & F_NET))
			snprintf(target, sizeof target, "every worker");
		printf("  fault %-14s %-12s %.0f-%.0fms: %s%s%s\n", check_fault_name(f->kind), target,
		       check_us_to_ms(f->start_us), check_us_to_ms(f->end_us),
		       f->ok ? heal : "FAILED: ", f->ok && f->note[0] ? "; " : "", f->note);
	}
	printf("\n  %-40s %8s\n", "property", "count");
	printf("  %-40s %8zu%s\n", "overlapping holds (store at fault)", r->unexplained,
	       r->unexplained ? "  VIOLATED" : "");
	printf("  %-40s %8zu\n", "overlaps after a pause (lease ran out)", r->noverlaps - r->unexplained);
	printf("  %-40s %8zu%s\n", "fences out of grant order", r->nfence_bad, r->nfence_bad ? "  VIOLATED" : "");
	printf("  %-40s %8lld%s\n", "lost updates", (long long)r->lost_updates, r->lost_updates ? "  VIOLATED" : "");
	printf("  %-40s %8zu%s\n", "stale writes accepted", r->stale_writes, r->stale_writes ? "  VIOLATED" : "");
	printf("  %-40s %8.0f\n", "worst fault end -> next grant (ms)", check_us_to_ms(r->worst_heal_us));
	if (r->stuck)
		printf("  %-40s %8zu\n", "workers stuck in a call at the end", r->stuck);
	if (r->not_run)
		printf("  %-40s %8u  NOT RUN\n", "requested faults/ops that never ran", r->not_run);
	if (any_violation(r))
		printf("\n  violations:\n");
	violation_lines(r, print_line, NULL);
	if (r->noverlaps > r->unexplained) {
		printf("\n  excused, not violations: %zu overlaps after a pause: %s\n", r->noverlaps - r->unexplained,
		       excused_why(o));
		excused_lines(r, print_line, NULL);
	}
	const char *v = check_verdict(r);
	printf("\nverdict: %s\n", r->pass ? "PASS: no safety property was violated"
				  : strcmp(v, "fail") == 0
					  ? "FAIL: at least one safety property was violated"
					  : "INCOMPLETE: nothing was violated, but a requested fault or op never ran");
}

/* The run as one JSON object; `full` adds every hold (for the report). */
void check_print_json(FILE *f, const check_opts *o, const char *shown, const results *r, bool full)
{
	fputs("{\"store\":", f);
	cli_json_str(f, shown);
	fputs(",\"name\":", f);
	cli_json_str(f, o->name);
	fprintf(f,
		",\"clients\":%u,\"duration_ms\":%.1f,\"ttl_ms\":%lld,\"hold_ms\":%lld,\"fencing\":%s,"
		"\"seed\":%" PRIu64
		",\"grants\":%zu,\"writes\":{\"accepted\":%lld,\"refused\":%lld,"
		"\"stale_accepted\":%zu},\"final_value\":%lld,\"errors\":%zu,"
		"\"overlaps\":%zu,\"overlaps_after_pause\":%zu,\"fence_order_violations\":%zu,"
		"\"lost_updates\":%lld,\"stale_writes_accepted\":%zu,\"worst_heal_to_grant_ms\":%.1f,\"workers_stuck\":%zu,"
		"\"ops\":\"%s%s%s\",\"holds_by_kind\":{\"plain\":%zu,\"extend\":%zu,\"handle\":%zu,\"run\":%zu},"
		"\"extends\":%lld,\"renewals_delayed\":%lld,\"not_run\":%u,\"not_run_why\":",
		o->clients, check_us_to_ms(r->end_us), (long long)o->ttl_ms, (long long)o->hold_ms,
		o->fencing ? "true" : "false", o->seed, r->nholds, (long long)r->reg.accepted,
		(long long)r->reg.rejected, r->stale_writes, (long long)r->reg.value, r->errors, r->unexplained,
		r->noverlaps - r->unexplained, r->nfence_bad, (long long)r->lost_updates, r->stale_writes,
		check_us_to_ms(r->worst_heal_us), r->stuck, (o->ops & OP_EXTEND) ? "extend" : "",
		(o->ops & OP_EXTEND) && (o->ops & OP_HANDLE) ? "," : "", (o->ops & OP_HANDLE) ? "handle" : "",
		r->kinds[K_PLAIN], r->kinds[K_EXTEND], r->kinds[K_HANDLE], r->kinds[K_RUN], r->extends, r->delayed,
		r->not_run);
	cli_json_str(f, r->not_run_why);
	fputs(",\"faults_by_kind\":{", f);
	const char *sep = "";
	for (unsigned k = F_PAUSE; k <= F_LAST; k <<= 1) {
		if (!(o->faults & k))
			continue;
		size_t done, failed;
		kind_counts(r, k, &done, &failed);
		fprintf(f, "%s\"%s\":{\"injected\":%zu,\"failed\":%zu}", sep, check_fault_name(k), done, failed);
		sep = ",";
	}
	fputs("},\"faults\":[", f);
	for (size_t k = 0; k < r->nfaults; k++) {
		const fault *x = &r->faults[k];
		fprintf(f,
			"%s{\"kind\":\"%s\",\"worker\":%d,\"member\":%d,\"start_ms\":%.1f,\"end_ms\":%.1f,"
			"\"ok\":%s,\"heal_to_grant_ms\":%.1f,\"split_ms\":%.1f,\"dropped_bytes\":%lld,\"count\":%lld,\"note\":",
			k ? "," : "", check_fault_name(x->kind), x->slot, x->member, check_us_to_ms(x->start_us),
			check_us_to_ms(x->end_us), x->ok ? "true" : "false",
			x->heal_to_grant_us < 0 ? -1.0 : check_us_to_ms(x->heal_to_grant_us),
			x->split_us < 0 ? -1.0 : check_us_to_ms(x->split_us), x->dropped, x->count);
		cli_json_str(f, x->note);
		fputc('}', f);
	}
	fputs("],\"violations\":[", f);
	size_t n = 0;
	for (size_t i = 0; i < r->noverlaps; i++) {
		const pair *p = &r->overlaps[i];
		if (p->explained)
			continue;
		const hold *a = &r->holds[p->a], *b = &r->holds[p->b];
		fprintf(f,
			"%s{\"kind\":\"overlap\",\"a\":{\"worker\":%d,\"fence\":%" PRIu64
			",\"grant_ms\":%.1f,"
			"\"end_ms\":%.1f},\"b\":{\"worker\":%d,\"fence\":%" PRIu64
			",\"grant_ms\":%.1f,\"end_ms\":%.1f}}",
			n++ ? "," : "", a->slot, a->fence, check_us_to_ms(a->t_grant), check_us_to_ms(a->t_end),
			b->slot, b->fence, check_us_to_ms(b->t_grant), check_us_to_ms(b->t_end));
		if (n >= 100)
			break; /* all are counted above; a sample is enough here */
	}
	for (size_t i = 0; i < r->nfence_bad; i++) {
		const hold *a = &r->holds[r->fence_bad[i].a], *b = &r->holds[r->fence_bad[i].b];
		fprintf(f,
			"%s{\"kind\":\"fence_order\",\"a\":{\"worker\":%d,\"fence\":%" PRIu64
			",\"grant_ms\":%.1f},"
			"\"b\":{\"worker\":%d,\"fence\":%" PRIu64 ",\"grant_ms\":%.1f}}",
			n++ ? "," : "", a->slot, a->fence, check_us_to_ms(a->t_grant), b->slot, b->fence,
			check_us_to_ms(b->t_grant));
	}
	for (size_t i = 0; i < r->nholds; i++) {
		const hold *h = &r->holds[i];
		if (!h->stale_write)
			continue;
		fprintf(f, "%s{\"kind\":\"stale_write\",\"a\":{\"worker\":%d,\"fence\":%" PRIu64 ",\"write_ms\":%.1f}}",
			n++ ? "," : "", h->slot, h->fence, check_us_to_ms(h->t_write));
	}
	fputc(']', f);
	if (full) {
		fputs(",\"holds\":[", f);
		for (size_t i = 0; i < r->nholds; i++) {
			const hold *h = &r->holds[i];
			fprintf(f,
				"%s{\"w\":%d,\"inc\":%d,\"fence\":%" PRIu64
				",\"req\":%.1f,\"grant\":%.1f,"
				"\"end\":%.1f,\"write\":%.1f,\"write_ok\":%d,\"stale\":%s,\"paused\":%s,"
				"\"killed\":%s,\"lost\":%s,\"kind\":\"%s\",\"extended\":%d,\"tool_killed\":%s}",
				i ? "," : "", h->slot, h->inc, h->fence, check_us_to_ms(h->t_req),
				check_us_to_ms(h->t_grant), check_us_to_ms(h->t_end),
				h->t_write < 0 ? -1.0 : check_us_to_ms(h->t_write), h->write_ok,
				h->stale_write ? "true" : "false", h->paused ? "true" : "false",
				h->killed ? "true" : "false",
				h->t_lost >= 0 && h->t_lost <= h->t_end ? "true" : "false", check_kind_name(h->kind),
				h->extended, h->tool_killed ? "true" : "false");
		}
		fputs("],\"overlap_pairs\":[", f);
		for (size_t i = 0; i < r->noverlaps; i++)
			fprintf(f, "%s[%d,%d,%.1f,%.1f,%s]", i ? "," : "", r->overlaps[i].a, r->overlaps[i].b,
				check_us_to_ms(r->overlaps[i].from_us), check_us_to_ms(r->overlaps[i].to_us),
				r->overlaps[i].explained ? "true" : "false");
		fputc(']', f);
	}
	fprintf(f, ",\"verdict\":\"%s\"}\n", check_verdict(r));
}

/* ---- the HTML report (readable without JavaScript) ---------------------------- */

static void html_line(void *ctx, const char *line)
{
	FILE *f = ctx;
	fputs("<li>", f);
	cli_html(f, line);
	fputs("</li>\n", f);
}

/* The width of a fence label in px (font-size 10), with room after it. */
static double label_w(uint64_t fence)
{
	char s[24];
	return 6.0 * snprintf(s, sizeof s, "%" PRIu64, fence) + 5;
}

static void html_row(FILE *f, const char *what, long long v, bool safety)
{
	fputs("<tr><td>", f);
	cli_html(f, what);
	fprintf(f, "</td><td class=\"n%s\">%lld</td></tr>\n", safety ? (v ? " bad" : " good") : "", v);
}

/* The body: summary, verdict table, violation lines, static SVG timeline
 * (wider for longer runs, in a box that scrolls), faults table. */
void check_write_report(FILE *f, const check_opts *o, const char *shown, const results *r)
{
	fputs("<div id=\"summary\"><p>store ", f);
	cli_html(f, shown);
	fputs(" \u2014 lock ", f);
	cli_html(f, o->name);
	fprintf(f, " \u2014 %u clients, %.1f s, ttl %lld ms, hold %lld ms, fencing %s, seed %" PRIu64 "</p>\n",
		o->clients, check_us_to_ms(r->end_us) / 1000.0, (long long)o->ttl_ms, (long long)o->hold_ms,
		o->fencing ? "on" : "off", o->seed);
	fprintf(f, "<div class=\"verdict %s\">%s</div></div>\n", r->pass ? "good" : "bad",
		r->pass                                 ? "PASS: no safety property was violated"
		: strcmp(check_verdict(r), "fail") == 0 ? "FAIL: a safety property was violated"
							: "INCOMPLETE: a requested fault or op never ran");
	size_t reads_refused = 0;
	for (size_t i = 0; i < r->nholds; i++)
		reads_refused += r->holds[i].read_ok == 0;
	fputs("<div id=\"verdicts\"><table><tr><th>property</th><th>count</th></tr>\n", f);
	html_row(f, "overlapping holds (store at fault)", (long long)r->unexplained, true);
	html_row(f, "overlaps after a pause (lease ran out while stopped)", (long long)(r->noverlaps - r->unexplained),
		 false);
	html_row(f, "fences out of grant order", (long long)r->nfence_bad, true);
	html_row(f, "lost updates", (long long)r->lost_updates, true);
	html_row(f, "stale writes accepted", (long long)r->stale_writes, true);
	html_row(f, "grants", (long long)r->nholds, false);
	html_row(f, "writes accepted", (long long)r->reg.accepted, false);
	html_row(f, "writes refused (stale fence)", (long long)r->reg.rejected, false);
	html_row(f, "reads refused (stale fence)", (long long)reads_refused, false);
	html_row(f, "final register value", (long long)r->reg.value, false);
	html_row(f, "worst fault end \u2192 next grant (ms)", (long long)(r->worst_heal_us / 1000), false);
	html_row(f, "store errors seen by workers", (long long)r->errors, false);
	if (o->ops || r->kinds[K_RUN]) {
		html_row(f, "holds extended under a delayed renewal", (long long)r->kinds[K_EXTEND], false);
		html_row(f, "holds through acquire/release handles", (long long)r->kinds[K_HANDLE], false);
		html_row(f, "holds of a dlock run command", (long long)r->kinds[K_RUN], false);
		html_row(f, "extends done", r->extends, false);
		html_row(f, "renewals delayed", r->delayed, false);
	}
	html_row(f, "requested faults/ops that never ran", (long long)r->not_run, true);
	fputs("</table></div>\n", f);
	fputs("<h2>Violations</h2>\n<ul id=\"violation-lines\">\n", f);
	violation_lines(r, html_line, f);
	if (!any_violation(r))
		fputs("<li>none</li>\n", f);
	fputs("</ul>\n", f);
	if (r->noverlaps > r->unexplained) {
		fprintf(f, "<h2 id=\"excused\">Excused, not violations: %zu overlaps after a pause</h2>\n<p>",
			r->noverlaps - r->unexplained);
		cli_html(f, excused_why(o));
		fputs(".</p>\n<ul id=\"excused-lines\">\n", f);
		excused_lines(r, html_line, f);
		fputs("</ul>\n", f);
	}
	fputs("<h2>Timeline</h2>\n", f);
	cli_check_report_legend(f);

	/* geometry: 60 px per second at least, so a long run is wide and scrolls;
	 * and wide enough that each hold's fence label ends before the next grant
	 * in its row: every bar carries its fence in plain sight, inside the bar
	 * when it is wide enough, else in the lane just above it. Past MAX_W px
	 * (a very long run) a lane label that would run into the previous one is
	 * left out: the bar's title and data-fence still carry it. */
	double end = check_us_to_ms(r->end_us);
	for (size_t i = 0; i < r->nholds; i++)
		end = check_us_to_ms(r->holds[i].t_end) > end ? check_us_to_ms(r->holds[i].t_end) : end;
	for (size_t k = 0; k < r->nfaults; k++)
		end = check_us_to_ms(r->faults[k].end_us) > end ? check_us_to_ms(r->faults[k].end_us) : end;
	if (end <= 0)
		end = 1;
	const double L = 90, R = 40, RH = 40, TOP = 24, LANE = 13, BH = RH - LANE - 5, MAX_W = 1000000;
	double px_ms = 60.0 / 1000;
	for (size_t i = 0; i < r->nholds; i++) {
		for (size_t j = i + 1; j < r->nholds; j++) {
			if (r->holds[j].slot != r->holds[i].slot)
				continue;
			double gap = check_us_to_ms(r->holds[j].t_grant - r->holds[i].t_grant);
			double need = label_w(r->holds[i].fence) / (gap > 0.01 ? gap : 0.01);
			if (need > px_ms)
				px_ms = need;
			break;
		}
	}
	double W = L + R + end * px_ms;
	W = W < 1200 ? 1200 : W > MAX_W ? MAX_W : W;
	double H = TOP + o->clients * RH + 30;
#define X(v) (L + (W - L - R) * (v) / end)
	fprintf(f,
		"<div id=\"timeline\"><svg id=\"timeline-svg\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
		"height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" preserveAspectRatio=\"none\">\n",
		W, H, W, H);
	double step = pow(10, floor(log10(end / 5)));
	if (end / step > 12)
		step *= 2;
	if (end / step > 12)
		step *= 2.5;
	while (end / step > 12 * W / 1200)
		step *= 2;
	for (double v = 0; v <= end; v += step) {
		fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"#eee\"/>", X(v), X(v),
			TOP - 4, H - 24);
		if (v >= 1000)
			fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%g s</text>\n", X(v), H - 8,
				v / 1000);
		else
			fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%g ms</text>\n", X(v), H - 8, v);
	}
	for (unsigned i = 0; i < o->clients; i++)
		fprintf(f,
			"<text x=\"6\" y=\"%.0f\">worker %u</text><line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.0f\" y2=\"%.0f\" "
			"stroke=\"#f3f3f3\"/>\n",
			TOP + i * RH + LANE + BH / 2 + 4, i, L, W - R, TOP + (i + 1) * RH, TOP + (i + 1) * RH);
	for (size_t k = 0; k < r->nfaults; k++) {
		const fault *x = &r->faults[k];
		bool all = x->slot < 0;
		double y = all ? TOP : TOP + x->slot * RH, hh = all ? o->clients * RH : RH;
		double w = X(check_us_to_ms(x->end_us)) - X(check_us_to_ms(x->start_us));
		fprintf(f,
			"<rect class=\"fault\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"#bbb\" "
			"fill-opacity=\"0.45\"><title>%s: %.0f\u2013%.0f ms",
			X(check_us_to_ms(x->start_us)), y, w > 2 ? w : 2, hh, check_fault_name(x->kind),
			check_us_to_ms(x->start_us), check_us_to_ms(x->end_us));
		if (!x->ok) {
			fputs(" (failed: ", f);
			cli_html(f, x->note);
			fputc(')', f);
		}
		fprintf(f, "</title></rect><text x=\"%.1f\" y=\"%.0f\">%s</text>\n", X(check_us_to_ms(x->start_us)) + 2,
			TOP - 8, check_fault_name(x->kind));
	}
	double lane_free[MAX_CLIENTS]; /* where the last label of each row ends */
	for (int i = 0; i < MAX_CLIENTS; i++)
		lane_free[i] = 0;
	for (size_t i = 0; i < r->nholds; i++) {
		const hold *x = &r->holds[i];
		double x0 = X(check_us_to_ms(x->t_grant)), y = TOP + x->slot * RH + LANE;
		double w = X(check_us_to_ms(x->t_end)) - x0;
		if (w < 1.5)
			w = 1.5;
		char text[160];
		hold_text(text, sizeof text, x);
		fprintf(f,
			"<rect class=\"hold\" data-fence=\"%" PRIu64
			"\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" "
			"rx=\"2\" fill=\"%s\"><title>%s</title></rect>",
			x->fence, x0, y, w, BH,
			x->killed   ? "#777"
			: x->paused ? "#d9a030"
				    : "#4a7fc1",
			text);
		double lw = label_w(x->fence);
		bool slot_ok = x->slot >= 0 && x->slot < MAX_CLIENTS;
		if (w >= lw) {
			fprintf(f,
				"<text class=\"fence\" x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#fff\" "
				"font-size=\"10\">%" PRIu64 "</text>",
				x0 + w / 2, y + BH / 2 + 4, x->fence);
		} else if (slot_ok && x0 + 0.5 >= lane_free[x->slot]) {
			fprintf(f,
				"<text class=\"fence\" x=\"%.1f\" y=\"%.0f\" fill=\"#333\" font-size=\"10\">%" PRIu64
				"</text>",
				x0, y - 3, x->fence);
			lane_free[x->slot] = x0 + lw;
		}
		if (x->t_write >= 0) {
			const char *c = x->stale_write ? "#f0f" : x->write_ok == 1 ? "#2a2" : "#000";
			fprintf(f,
				"<line class=\"%s\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
				"stroke-width=\"2.5\"/>",
				x->stale_write     ? "write stale"
				: x->write_ok == 1 ? "write"
						   : "write refused",
				X(check_us_to_ms(x->t_write)), X(check_us_to_ms(x->t_write)), y - 2, y + BH + 2, c);
		}
		if (x->read_ok == 0 && x->t_read >= 0)
			fprintf(f,
				"<circle class=\"marker refused\" cx=\"%.1f\" cy=\"%.0f\" r=\"3\" fill=\"#000\">"
				"<title>read refused: fence %" PRIu64 " is stale</title></circle>",
				X(check_us_to_ms(x->t_read)), y + BH + 2, x->fence);
		fputc('\n', f);
	}
	for (size_t i = 0; i < r->noverlaps; i++) {
		const pair *p = &r->overlaps[i];
		for (int k = 0; k < 2; k++) {
			const hold *x = &r->holds[k ? p->b : p->a];
			double w = X(check_us_to_ms(p->to_us)) - X(check_us_to_ms(p->from_us));
			fprintf(f,
				"<rect class=\"overlap\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"#e00\" "
				"fill-opacity=\"0.75\"><title>overlap of fences %" PRIu64 " and %" PRIu64
				" from %.1f to %.1f ms%s</title></rect>\n",
				X(check_us_to_ms(p->from_us)), TOP + x->slot * RH + LANE, w > 1.5 ? w : 1.5, BH,
				r->holds[p->a].fence, r->holds[p->b].fence, check_us_to_ms(p->from_us),
				check_us_to_ms(p->to_us),
				p->explained ? " (holder was paused: its lease ran out)" : "");
		}
	}
	for (size_t i = 0; i < r->nfence_bad; i++) {
		const hold *a = &r->holds[r->fence_bad[i].a], *b = &r->holds[r->fence_bad[i].b];
		double cx = X(check_us_to_ms(b->t_grant)), cy = TOP + b->slot * RH + LANE;
		fprintf(f,
			"<path class=\"marker fence-order\" d=\"M%.1f %.1f l-5 -8 h10 z\" fill=\"#f80\"><title>fence %" PRIu64
			" granted after fence %" PRIu64 " (worker %d): out of order</title></path>\n",
			cx, cy, b->fence, a->fence, a->slot);
	}
#undef X
	fputs("</svg></div>\n", f);
	if (o->faults) {
		fputs("<h2>Faults</h2>\n<table id=\"fault-kinds\"><tr><th>fault kind</th><th>injected</th>"
		      "<th>failed</th></tr>\n",
		      f);
		for (unsigned k = F_PAUSE; k <= F_LAST; k <<= 1) {
			if (!(o->faults & k))
				continue;
			size_t done, failed;
			kind_counts(r, k, &done, &failed);
			fprintf(f, "<tr><td>%s</td><td class=\"n%s\">%zu</td><td class=\"n\">%zu</td></tr>\n",
				check_fault_name(k), done ? "" : " bad", done, failed);
		}
		fputs("</table>\n", f);
	}
	if (r->nfaults) {
		fputs("<table id=\"faults\"><tr><th>fault</th><th>target</th><th>start ms</th><th>end ms</th>"
		      "<th>end \u2192 next grant ms</th><th>note</th></tr>\n",
		      f);
		for (size_t k = 0; k < r->nfaults; k++) {
			const fault *x = &r->faults[k];
			char target[32] = "server";
			if (x->slot >= 0)
				snprintf(target, sizeof target, "worker %d", x->slot);
			else if (x->member >= 0)
				snprintf(target, sizeof target, "member %d", x->member);
			else if (x->kind & F_NET)
				snprintf(target, sizeof target, "every worker");
			fprintf(f,
				"<tr><td>%s</td><td>%s</td><td class=\"n\">%.0f</td><td class=\"n\">%.0f</td><td class=\"n\">",
				check_fault_name(x->kind), target, check_us_to_ms(x->start_us),
				check_us_to_ms(x->end_us));
			if (x->heal_to_grant_us < 0)
				fputs("none", f);
			else
				fprintf(f, "%.0f", check_us_to_ms(x->heal_to_grant_us));
			fputs("</td><td>", f);
			if (!x->ok)
				fputs("FAILED: ", f);
			cli_html(f, x->note);
			fputs("</td></tr>\n", f);
		}
		fputs("</table>\n", f);
	}
}
