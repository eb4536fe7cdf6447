#!/usr/bin/env bash
# The training report rendered by a browser: a short training run writes
# RUN/report.html; headless Chromium (Debian's chromium, which
# scripts/deps.sh test installs) loads a copy with a checking script added
# at its end and prints the DOM that script leaves. Each figure's plot must
# be laid out with a size, each line plot's polylines must have an extent,
# and the time bars must be drawn: a report whose SVG a browser cannot parse
# or lay out fails here even when its text looks right.
#
# usage: tests/report/chromium.sh DLREC_BIN WORKDIR
set -euo pipefail
bin=$1
dir=$2
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "chromium is not installed (scripts/deps.sh test installs it)" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
"$bin" synth -q --rows 4000 --seed 2 --max-cardinality 300 --out clicks.tsv
"$bin" etl fit -q --input clicks.tsv --out etl --min-count 2
"$bin" etl apply -q --etl etl --input clicks.tsv --out train.dlr --valid-fraction 0.2 --valid-out valid.dlr --seed 1
cat > cfg.json <<'JSON'
{"model": {"type": "dlrm", "embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]},
 "training": {"batch_size": 64, "epochs": 1, "threads": 1},
 "eval": {"interval_steps": 10}, "log": {"interval_steps": 5}}
JSON
"$bin" train -q --config cfg.json --train train.dlr --valid valid.dlr --etl etl --out run > /dev/null
test -s run/report.html

# The check: figures, and what each one drew, as the browser laid it out.
sed 's|</body>|<script>\
const out = [];\
for (const fig of document.querySelectorAll("figure")) {\
  const svg = fig.querySelector("svg");\
  if (!svg) { out.push(fig.id + ":nosvg"); continue; }\
  const box = svg.getBoundingClientRect();\
  let lines = 0, bars = 0;\
  for (const p of svg.querySelectorAll("polyline")) { const b = p.getBBox(); if (b.width > 0 \&\& b.height > 0) lines++; }\
  for (const r of svg.querySelectorAll("rect.bar")) { if (r.getBBox().height > 0) bars++; }\
  out.push(fig.id + ":" + (box.width > 100 \&\& box.height > 100 ? "shown" : "hidden") + ":" + lines + ":" + bars);\
}\
const pre = document.createElement("pre"); pre.id = "check"; pre.textContent = out.join(" "); document.body.appendChild(pre);\
</script></body>|' run/report.html > check.html
grep -q 'pre.id = "check"' check.html || { echo "could not add the check to the report" >&2; exit 1; }

timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
  --user-data-dir="$dir/profile" --virtual-time-budget=5000 --dump-dom "file://$dir/check.html" > dom.html 2> chromium.log || {
  echo "chromium failed:" >&2; tail -20 chromium.log >&2; exit 1; }
result=$(sed -n 's|.*<pre id="check">\([^<]*\)</pre>.*|\1|p' dom.html)
echo "rendered: $result"
want="loss:shown:3:0 auc:shown:2:0 calibration:shown:1:0 throughput:shown:1:0 profile:shown:0:7"
if [ "$result" != "$want" ]; then
  echo "the report did not render as expected: want '$want'" >&2
  exit 1
fi
echo "report rendered with every plot"
