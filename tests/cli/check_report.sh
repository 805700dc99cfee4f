#!/bin/bash
# `dlock check --report`: one self-contained HTML file that headless Chromium
# (Debian's chromium) renders; counted in the rendered DOM: one hold bar per
# grant (from --json), red overlap marks after a pause with fencing off, the
# pause shaded, and the verdict table on top. Chromium missing is a failure.
. "$(dirname "$0")/lib.sh" "$@"

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

# An unwritable report path is a usage error before the run, not a crash after it.
expect_rc 64 "unwritable report" "$DLOCK" --store "sqlite://$T/c.db" check --duration 300ms --report "$T/no/such/dir/r.html"
check "names the report path" grep -q "no/such/dir/r.html" "$T/err"
finish
