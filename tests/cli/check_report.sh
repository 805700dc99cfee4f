#!/bin/bash
# `dlock check --report`: one self-contained HTML file that headless Chromium
# (Debian's chromium) renders; counted in the rendered DOM: one hold bar per
# grant (from --json), red overlap marks after a pause with fencing off, the
# pause shaded, and the verdict table on top; and a 30 s x 5 clients report
# read without JavaScript (docs/cli.md). Chromium missing is a failure.
. "$(dirname "$0")/lib.sh" "$@"

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || { echo "FAIL: chromium not installed (apt-get install chromium; scripts/packages/check.test)" >&2; exit 1; }

# render FILE: the DOM after scripts ran, on stdout.
render() {
	local prof; prof=$(mktemp -d "$T/chromium.XXXXXX")
	timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
		--disable-background-networking --disable-component-update --disable-sync \
		--user-data-dir="$prof" --dump-dom "file://$1" 2>"$T/chromium.err"
}

R="$T/report.html"
expect_rc 1 "pause with fencing off" "$DLOCK" --store "sqlite://$T/r.db" --json check \
	--clients 3 --duration 3s --ttl 300ms --hold 40ms --faults pause --fencing off --seed 11 --report "$R"
grants=$(json_num grants "$T/out")
check "report written" [ -s "$R" ]
check "grants in json ($grants)" [ "${grants:-0}" -gt 0 ]
check "self-contained: no external resources" bash -c "! grep -Eiq '(src|href)=\"(https?:)?//' '$R'"

render "$R" >"$T/dom.html"
check "chromium rendered the report" grep -q '<svg' "$T/dom.html"
bars=$(grep -o 'class="hold"' "$T/dom.html" | wc -l)
check "hold bars in the DOM ($bars) = grants ($grants)" [ "$bars" -eq "${grants:--1}" ]
check "overlaps drawn in red" grep -q 'class="overlap"[^>]*fill="#e00"' "$T/dom.html"
check "the pause is shaded" grep -q 'class="fault"' "$T/dom.html"
check "bars are labelled with fences" grep -Eq 'class="hold" data-fence="[0-9]+"' "$T/dom.html"
check "verdict FAIL shown" grep -q 'FAIL: a safety property was violated' "$T/dom.html"
tpos=$(grep -bo 'stale writes accepted</td>' "$T/dom.html" | head -1 | cut -d: -f1)
spos=$(grep -bo '<svg' "$T/dom.html" | head -1 | cut -d: -f1)
check "verdict table ($tpos) before the timeline ($spos)" [ "${tpos:-99999999}" -lt "${spos:-0}" ]

# A clean run: the same count, a PASS verdict, no red.
expect_rc 0 "clean run" "$DLOCK" --store "sqlite://$T/c.db" --json check \
	--clients 2 --duration 1s --ttl 300ms --hold 40ms --report "$T/clean.html"
grants=$(json_num grants "$T/out")
render "$T/clean.html" >"$T/dom2.html"
bars=$(grep -o 'class="hold"' "$T/dom2.html" | wc -l)
check "clean: hold bars ($bars) = grants ($grants)" [ "$bars" -eq "${grants:--1}" ]
check "clean: no overlap marks" bash -c "! grep -q 'class=\"overlap\"' '$T/dom2.html'"
check "clean: verdict PASS shown" grep -q 'PASS: no safety property was violated' "$T/dom2.html"

# 30 s x 5 clients with a pause and fencing off, read WITHOUT JavaScript: the
# summary, the verdict table, every violation line the terminal printed, the
# timeline (a bar per grant, overlaps, markers of refused accesses) are in
# the static page; a screenshot is not blank; the timeline is wider than the
# window (it scrolls) and the zoom buttons come only with JavaScript.
L="$T/long.html"
expect_rc 1 "30 s x 5 clients" "$DLOCK" --store "sqlite://$T/l.db" check \
	--clients 5 --duration 30s --ttl 300ms --hold 40ms --faults pause --fencing off --seed 7 --report "$L"
cp "$T/out" "$T/long.txt"
"$DLOCK" --store "sqlite://$T/l2.db" --json check --clients 5 --duration 1s --ttl 300ms --hold 40ms >/dev/null 2>&1
# Headless Chromium's --dump-dom and --screenshot work through JavaScript
# themselves (with scripts disabled they write nothing), so the static page
# is checked as written, and its rendering without JavaScript by a
# screenshot of a copy with every executable script removed: the hold bars'
# blue and the overlaps' red are on screen.
render_nojs() {
	local prof; prof=$(mktemp -d "$T/chromium.XXXXXX")
	timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
		--disable-background-networking --disable-component-update --disable-sync \
		--user-data-dir="$prof" "$@" 2>>"$T/chromium.err"
}
grants=$(sed -n 's/.*grants \([0-9][0-9]*\),.*/\1/p' "$T/long.txt" | head -1)
bars=$(grep -o 'class="hold"' "$L" | wc -l)
check "static: a bar per grant ($bars of ${grants:-?})" [ "$bars" -eq "${grants:--1}" ]
check "static: verdict shown" grep -q 'FAIL: a safety property was violated' "$L"
check "static: verdict table" grep -q 'overlapping holds (store at fault)</td>' "$L"
check "static: overlaps drawn" grep -q 'class="overlap"' "$L"
check "static: the zoom buttons come from the script" bash -c "! grep -q '<button' '$L'"
nlines=$(grep -c '^  \(OVERLAP\|FENCE ORDER\|STALE WRITE\|LOST UPDATES\|NOT RUN\)' "$T/long.txt")
nli=$(sed -n '/<ul id="violation-lines">/,/<\/ul>/p' "$L" | grep -c '<li>')
check "static: the $nlines violation lines of the terminal are in the report ($nli)" [ "$nli" -eq "$nlines" -a "$nlines" -gt 0 ]
nex=$(grep -c '^  overlap after pause:' "$T/long.txt")
nexli=$(sed -n '/<ul id="excused-lines">/,/<\/ul>/p' "$L" | grep -c '<li>overlap after pause: ')
check "static: the $nex excused lines of the terminal are in the report's own list ($nexli)" [ "$nexli" -eq "$nex" -a "$nex" -gt 0 ]
first=$(grep -m1 '^  \(OVERLAP\|STALE WRITE\|LOST UPDATES\)' "$T/long.txt" | sed 's/^  //')
check "static: the first line verbatim, a real violation" grep -qF "<li>$first</li>" "$L"
bars=$(grep -o 'class="hold"' "$L" | wc -l)
labels=$(grep -o 'class="fence"' "$L" | wc -l)
check "static: every bar shows its fence ($labels labels, $bars bars)" [ "$labels" -eq "$bars" ]
w=$(grep -o 'id="timeline-svg"[^>]*width="[0-9]*"' "$L" | grep -o ' width="[0-9]*"' | grep -o '[0-9]*')
check "static: 30 s timeline wider than 1200 px, scrolls (${w:-?})" [ "${w:-0}" -gt 1200 ]
"$PY" -c '
import re, sys
html = open(sys.argv[1]).read()
out = re.sub(r"<script>.*?</script>", "", html, flags=re.S)
assert "<script>" not in out
open(sys.argv[2], "w").write(out)' "$L" "$T/nojs.html"
render_nojs --screenshot="$T/long.png" --window-size=1280,4000 "file://$T/nojs.html" >/dev/null
check "no JS: a screenshot" [ -s "$T/long.png" ]
check "no JS: hold bars (blue) and overlaps (red) on screen" "$PY" - "$T/long.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat = 8, b''
while pos < len(data):
    n, = struct.unpack('>I', data[pos:pos + 4]); kind = data[pos + 4:pos + 8]; body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
    if kind == b'IDAT':
        idat += body
    pos += 12 + n
assert depth == 8 and ctype in (2, 6), (depth, ctype)
bpp = 3 if ctype == 2 else 4
raw, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
blue = red = 0
for line in rows:
    for x in range(0, stride, bpp):
        r, g, b = line[x], line[x + 1], line[x + 2]
        blue += abs(r - 0x4a) < 24 and abs(g - 0x7f) < 24 and abs(b - 0xc1) < 24
        red += r > 200 and g < 90 and b < 90
# The legend has 140 blue pixels; a 2.3 px bar shows 10-30 between the green
# write marks drawn over it, and how many fall in the first 1280 px depends
# on the run (952 in a loaded CI run, 1450 on a quiet one): the bar colour
# on more than twice the legend's pixels means bars are drawn.
assert blue > 2 * 140 + 100 and red > 20, (blue, red)
PY

# An unwritable report path is a usage error before the run, not a crash after it.
expect_rc 64 "unwritable report" "$DLOCK" --store "sqlite://$T/c.db" check --duration 300ms --report "$T/no/such/dir/r.html"
check "names the report path" grep -q "no/such/dir/r.html" "$T/err"
finish
