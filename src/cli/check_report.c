/*
 * check_report.c — the HTML report of `dlock check --report FILE.html`.
 *
 * One self-contained file (no network, no external scripts or fonts): the run
 * as JSON in a <script type="application/json"> element and a small script
 * that draws the verdict table and an SVG timeline from it — one row per
 * worker, one bar per hold labelled with its fence (class "hold", so a test
 * can count them in the rendered DOM), overlaps in red, faults shaded, writes
 * as ticks (green accepted, black refused, red a stale write accepted).
 */
#include "cli.h"

#include <string.h>

static const char head[] =
	"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
	"<title>dlock check report</title>\n<style>\n"
	"body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\n"
	"h1{font-size:1.3em;margin:0 0 .3em}\n"
	"table{border-collapse:collapse;margin:.6em 0}\n"
	"td,th{border:1px solid #ccc;padding:3px 10px;text-align:left}\n"
	"td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
	".bad{background:#fdd;color:#900;font-weight:bold}.good{background:#dfd}\n"
	".verdict{font-size:1.2em;font-weight:bold;padding:.3em .6em;display:inline-block}\n"
	"svg{border:1px solid #ddd;background:#fff}\n"
	"svg text{font:11px system-ui,sans-serif}\n"
	".legend span{display:inline-block;width:14px;height:10px;margin:0 4px 0 12px}\n"
	"</style></head><body>\n"
	"<h1>dlock check</h1>\n<div id=\"summary\"></div>\n<div id=\"verdicts\"></div>\n"
	"<div class=\"legend\"><span style=\"background:#4a7fc1\"></span>hold (label: fence)"
	"<span style=\"background:#d9a030\"></span>hold that was paused"
	"<span style=\"background:#777\"></span>hold that was killed"
	"<span style=\"background:#e00\"></span>overlap"
	"<span style=\"background:#bbb\"></span>fault"
	"<span style=\"background:#2a2\"></span>write accepted"
	"<span style=\"background:#000\"></span>refused"
	"<span style=\"background:#f0f\"></span>stale write accepted</div>\n"
	"<div id=\"timeline\"></div>\n<div id=\"faults\"></div>\n"
	"<noscript><p>This report draws its tables and timeline with JavaScript; the raw data "
	"is in the page source.</p></noscript>\n"
	"<script type=\"application/json\" id=\"data\">";

static const char *const tail[] = {
	"</script>\n<script>\n"
	"'use strict';\n"
	"const D=JSON.parse(document.getElementById('data').textContent);\n"
	"const NS='http://www.w3.org/2000/svg';\n"
	"function el(n,a,p){const e=document.createElementNS(NS,n);for(const k in a)e.setAttribute(k,a[k]);if(p)p.appendChild(e);return e;}\n"
	"function h(tag,text,cls){const e=document.createElement(tag);if(text!==undefined)e.textContent=text;if(cls)e.className=cls;return e;}\n"
	"function tip(e,t){el('title',{},e).textContent=t;}\n"
	"const s=document.getElementById('summary');\n"
	"s.appendChild(h('p','store '+D.store+' \\u2014 lock '+D.name+' \\u2014 '+D.clients+' clients, '+(D.duration_ms/1000).toFixed(1)+' s, ttl '+D.ttl_ms+' ms, hold '+D.hold_ms+' ms, fencing '+(D.fencing?'on':'off')+', seed '+D.seed));\n"
	"s.appendChild(h('div',D.verdict==='pass'?'PASS: no safety property was violated':'FAIL: a safety property was violated','verdict '+(D.verdict==='pass'?'good':'bad')));\n"
	"const rows=[['overlapping holds (store at fault)',D.overlaps,true],['overlaps after a pause (lease ran out while stopped)',D.overlaps_after_pause,false],"
	"['fences out of grant order',D.fence_order_violations,true],['lost updates',D.lost_updates,true],['stale writes accepted',D.stale_writes_accepted,true],"
	"['grants',D.grants,false],['writes accepted',D.writes.accepted,false],['writes refused (stale fence)',D.writes.refused,false],"
	"['final register value',D.final_value,false],['worst fault end \\u2192 next grant (ms)',D.worst_heal_to_grant_ms,false],['store errors seen by workers',D.errors,false]];\n"
	"const t=h('table');const hr=h('tr');hr.appendChild(h('th','property'));hr.appendChild(h('th','count'));t.appendChild(hr);\n"
	"for(const [k,v,safety] of rows){const tr=h('tr');tr.appendChild(h('td',k));tr.appendChild(h('td',String(v),'n '+(safety?(v?'bad':'good'):'')));t.appendChild(tr);}\n"
	"document.getElementById('verdicts').appendChild(t);\n"
	,
	"const W=1200,L=90,R=20,RH=30,TOP=24;\n"
	"const nrows=D.clients;const H=TOP+nrows*RH+30;\n"
	"let end=D.duration_ms;for(const x of D.holds)end=Math.max(end,x.end);for(const f of D.faults)end=Math.max(end,f.end_ms);\n"
	"const X=v=>L+(W-L-R)*v/end;\n"
	"const svg=el('svg',{width:W,height:H,viewBox:'0 0 '+W+' '+H,id:'timeline-svg'});\n"
	"const gf=el('g',{},svg),gh=el('g',{},svg),go=el('g',{},svg),gw=el('g',{},svg);\n"
	"let step=Math.pow(10,Math.floor(Math.log10(end/5)));if(end/step>12)step*=2;if(end/step>12)step*=2.5;\n"
	"for(let v=0;v<=end;v+=step){el('line',{x1:X(v),x2:X(v),y1:TOP-4,y2:H-24,stroke:'#eee'},gf);el('text',{x:X(v),y:H-8,'text-anchor':'middle'},svg).textContent=(v>=1000?(v/1000)+' s':v+' ms');}\n"
	"for(let i=0;i<nrows;i++){el('text',{x:6,y:TOP+i*RH+RH/2+4},svg).textContent='worker '+i;el('line',{x1:L,x2:W-R,y1:TOP+(i+1)*RH,y2:TOP+(i+1)*RH,stroke:'#f3f3f3'},gf);}\n"
	"for(const f of D.faults){const all=f.worker<0;const y=all?TOP:TOP+f.worker*RH;const hh=all?nrows*RH:RH;"
	"const r=el('rect',{class:'fault',x:X(f.start_ms),y:y,width:Math.max(2,X(f.end_ms)-X(f.start_ms)),height:hh,fill:'#bbb','fill-opacity':0.45},gf);"
	"tip(r,f.kind+(f.member>=0?' member '+f.member:'')+(f.worker>=0?' worker '+f.worker:'')+': '+f.start_ms+'\\u2013'+f.end_ms+' ms'+(f.ok?'':' (failed: '+f.note+')'));"
	"el('text',{x:X(f.start_ms)+2,y:TOP-8},gf).textContent=f.kind;}\n"
	"for(const x of D.holds){const y=TOP+x.w*RH+5,w=Math.max(1.5,X(x.end)-X(x.grant));"
	"const r=el('rect',{class:'hold','data-fence':x.fence,x:X(x.grant),y:y,width:w,height:RH-10,rx:2,fill:x.killed?'#777':x.paused?'#d9a030':'#4a7fc1'},gh);"
	"tip(r,'worker '+x.w+' fence '+x.fence+': requested '+x.req+' ms, granted '+x.grant+' ms, believed held until '+x.end+' ms'+(x.lost?' (lost signal)':'')+(x.killed?' (killed)':'')+(x.paused?' (paused)':''));"
	"if(w>7*String(x.fence).length+4){const tx=el('text',{x:X(x.grant)+w/2,y:y+RH/2,'text-anchor':'middle',fill:'#fff'},gh);tx.textContent=x.fence;}"
	"if(x.write>=0){const c=x.stale?'#f0f':x.write_ok===1?'#2a2':'#000';el('line',{x1:X(x.write),x2:X(x.write),y1:y-3,y2:y+RH-7,stroke:c,'stroke-width':2.5},gw);}}\n"
	"for(const [a,b,from,to,expl] of D.overlap_pairs){for(const k of [a,b]){const x=D.holds[k];"
	"const r=el('rect',{class:'overlap',x:X(from),y:TOP+x.w*RH+5,width:Math.max(1.5,X(to)-X(from)),height:RH-10,fill:'#e00','fill-opacity':0.75},go);"
	"tip(r,'overlap of fences '+D.holds[a].fence+' and '+D.holds[b].fence+' from '+from+' to '+to+' ms'+(expl?' (holder was paused: its lease ran out)':''));}}\n"
	"document.getElementById('timeline').appendChild(svg);\n"
	"if(D.faults.length){const ft=h('table');const r0=h('tr');for(const c of ['fault','target','start ms','end ms','end \\u2192 next grant ms','note'])r0.appendChild(h('th',c));ft.appendChild(r0);"
	"for(const f of D.faults){const tr=h('tr');for(const c of [f.kind,f.worker>=0?'worker '+f.worker:f.member>=0?'member '+f.member:['partition','lose-reply','delay'].includes(f.kind)?'every worker':'server',f.start_ms,f.end_ms,f.heal_to_grant_ms<0?'none':f.heal_to_grant_ms,f.ok?f.note:'FAILED: '+f.note])tr.appendChild(h('td',String(c)));ft.appendChild(tr);}"
	"document.getElementById('faults').appendChild(ft);}\n"
	"</script>\n</body></html>\n",
};

int cli_check_report(FILE *out, const char *json)
{
	fputs(head, out);
	/* "</" would end the script element early (a store URI can hold anything). */
	for (const char *p = json; *p; p++) {
		if (p[0] == '<' && p[1] == '/')
			fputs("<\\", out);
		else
			fputc(*p, out);
	}
	for (size_t i = 0; i < sizeof tail / sizeof *tail; i++)
		fputs(tail[i], out);
	return ferror(out) ? -1 : 0;
}
