#!/usr/bin/env bash
# Renders the report index and a failing test's page in headless Chromium
# (Debian's, installed here if missing), checks the rendered DOM with
# scripts/browser-check.py, and keeps screenshots, printing their paths.
#
#   scripts/browser-check.sh [OUT_DIR]     (default: target/browser-check)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
if ! command -v chromium >/dev/null; then
    echo "browser-check: installing Debian's chromium" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
out=$(realpath -m "${1:-target/browser-check}")
rm -rf "$out" && mkdir -p "$out"
# The test writes a failing leak (two sites) and a passing neighbour.
cargo test -q --test reports a_failing_test_has_a_page_with_a_series_per_site >/dev/null
reports=$PWD/target/test-scratch/page
page=$(ls "$reports"/watched_cache.cpu.*.html)
# Flags for a machine without network or display (see the env notes).
browser() {
    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$out/profile" "$@" 2>/dev/null
}
browser --dump-dom "file://$reports/index.html" >"$out/index.dom.html"
browser --dump-dom "file://$page" >"$out/page.dom.html"
browser --screenshot="$out/index.png" --window-size=1280,700 "file://$reports/index.html"
browser --screenshot="$out/page.png" --window-size=1280,2600 "file://$page"
python3 scripts/browser-check.py "$out/index.dom.html" "$out/page.dom.html" "$reports"
# Two runs into one folder, the second of fewer tests: the page's script
# keeps each report's newest row and marks the first run's others stale.
runs=$out/two-runs
for run in first second; do
    filter=$([ $run = first ] && echo "" || echo "setup_form")
    GPU_LEAK_TEST_REPORT_DIR=$runs NEXTEST_RUN_ID=$run cargo test -q --test macro_forms -- $filter >/dev/null 2>&1
done
browser --dump-dom "file://$runs/index.html" >"$out/two-runs.dom.html"
browser --screenshot="$out/two-runs.png" --window-size=1280,900 "file://$runs/index.html"
python3 scripts/browser-check.py --runs "$out/two-runs.dom.html" "$runs"
echo "screenshots: $out/index.png $out/page.png $out/two-runs.png"
