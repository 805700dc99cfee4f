/*
 * check_report.c — the frame of the HTML report of `dlock check --report
 * FILE.html` (check.c writes its body from the run's results).
 *
 * One self-contained file (no network, no external scripts or fonts) that
 * reads without JavaScript: the summary, the verdict table, every violation
 * line, a static SVG timeline and the faults table are plain HTML/SVG. A
 * small script only adds zoom buttons to the timeline (which scrolls
 * sideways without it). The run is also embedded as JSON in a
 * <script type="application/json"> element, for machines.
 */
#include "cli.h"

#include <string.h>

static const char head[] =
	"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
	"<title>dlock check report</title>\n<style>\n"
	"body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\n"
	"h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.1em;margin:1em 0 .3em}\n"
	"table{border-collapse:collapse;margin:.6em 0}\n"
	"td,th{border:1px solid #ccc;padding:3px 10px;text-align:left}\n"
	"td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
	".bad{background:#fdd;color:#900;font-weight:bold}.good{background:#dfd}\n"
	".verdict{font-size:1.2em;font-weight:bold;padding:.3em .6em;display:inline-block}\n"
	"#violation-lines li,#excused-lines li{font-family:ui-monospace,monospace;font-size:12px}\n"
	"#timeline{overflow-x:auto;border:1px solid #ddd;max-width:100%}\n"
	"svg{background:#fff;display:block}\n"
	"svg text{font:11px system-ui,sans-serif}\n"
	".legend span{display:inline-block;width:14px;height:10px;margin:0 4px 0 12px}\n"
	".zoom button{margin-right:4px}\n"
	"</style></head><body>\n"
	"<h1>dlock check</h1>\n";

static const char legend[] =
	"<div class=\"legend\"><span style=\"background:#4a7fc1\"></span>hold (label: fence)"
	"<span style=\"background:#d9a030\"></span>hold that was paused"
	"<span style=\"background:#777\"></span>hold that was killed"
	"<span style=\"background:#e00\"></span>overlap"
	"<span style=\"background:#bbb\"></span>fault"
	"<span style=\"background:#2a2\"></span>write accepted"
	"<span style=\"background:#000\"></span>access refused (stale fence)"
	"<span style=\"background:#f0f\"></span>stale write accepted"
	"<span style=\"background:#f80\"></span>fence out of order</div>\n";

static const char zoom_script[] =
	"<script>\n'use strict';\n"
	"(function(){const svg=document.getElementById('timeline-svg');if(!svg)return;\n"
	"const w0=+svg.getAttribute('width');let z=1;\n"
	"const bar=document.createElement('div');bar.className='zoom';\n"
	"for(const [t,f] of [['zoom in',2],['zoom out',0.5],['fit',0]]){const b=document.createElement('button');b.textContent=t;"
	"b.onclick=()=>{z=f?Math.min(64,Math.max(1/16,z*f)):document.getElementById('timeline').clientWidth/w0;"
	"svg.setAttribute('width',Math.round(w0*z));};bar.appendChild(b);}\n"
	"svg.parentNode.parentNode.insertBefore(bar,svg.parentNode);})();\n"
	"</script>\n";

void cli_html(FILE *f, const char *s)
{
	for (; s && *s; s++) {
		switch (*s) {
                /* clang-format off */
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '&': fputs("&amp;", f); break;
		case '"': fputs("&quot;", f); break;
		default: fputc(*s, f);
                /* clang-format on */
		}
	}
}

void cli_check_report_begin(FILE *f)
{
	fputs(head, f);
}

void cli_check_report_legend(FILE *f)
{
	fputs(legend, f);
}

int cli_check_report_end(FILE *f, const char *json)
{
	fputs("<script type=\"application/json\" id=\"data\">", f);
	/* "</" would end the script element early (a store URI can hold anything). */
	for (const char *p = json; p && *p; p++) {
		if (p[0] == '<' && p[1] == '/')
			fputs("<\\", f);
		else
			fputc(*p, f);
	}
	fputs("</script>\n", f);
	fputs(zoom_script, f);
	fputs("</body></html>\n", f);
	return ferror(f) ? -1 : 0;
}
