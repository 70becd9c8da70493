"""Checks report pages as a browser rendered them.

    browser-check.py DUMPED_INDEX DUMPED_PAGE REPORT_DIR
    browser-check.py --runs DUMPED_INDEX REPORT_DIR

DUMPED_* are the DOMs headless Chromium printed (--dump-dom) for index.html
and a failing test's page in REPORT_DIR. Every report in index.rows must be
one row of the index (its newest), every link must resolve to a file in
REPORT_DIR, the summary must count the latest run's rows, and the page's
chart of retained bytes by site must have one series per site. With --runs,
REPORT_DIR holds two runs: the rows of the later one are current, the
others stale, and the summary says so.
"""
import html.parser
import json
import os
import sys


class Collect(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows = 0
        self.current = 0
        self.stems = []
        self.links = []
        self.series = 0
        self.site_rows = 0
        self.in_summary = False
        self.summary = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "p" and attrs.get("id") == "run":
            self.in_summary = True
        if tag == "tr" and ({"current", "stale"} & set(classes)):
            self.rows += 1
            self.current += "current" in classes
            self.stems.append(attrs.get("data-stem"))
        if tag == "tr" and "site" in classes:
            self.site_rows += 1
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "polygon" and "site-series" in classes:
            self.series += 1

    def handle_endtag(self, tag):
        if tag == "p":
            self.in_summary = False

    def handle_data(self, data):
        if self.in_summary:
            self.summary += data


def parse(path):
    collected = Collect()
    with open(path, encoding="utf-8") as f:
        collected.feed(f.read())
    return collected


def read_rows(report_dir):
    """Every row of index.rows, in the order written."""
    with open(os.path.join(report_dir, "index.rows"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def newest_rows(written):
    """The newest row of each report among rows in the order written
    (later lines win)."""
    return {row["stem"]: row for row in written}


def check_index(index, rows, failures):
    if sorted(index.stems) != sorted(rows):
        failures.append(f"index: rendered rows {sorted(index.stems)}, reports in index.rows {sorted(rows)}")
    if f"Latest run: {index.current} tests" not in index.summary:
        failures.append(f"index: {index.current} current rows, but the summary says {index.summary!r}")


def check_runs(index_dom, report_dir):
    failures = []
    written = read_rows(report_dir)
    rows = newest_rows(written)
    index = parse(index_dom)
    check_index(index, rows, failures)
    # The page's rule: the run of the last row written is current. Not the
    # largest `written_at`: it counts whole seconds, and two quick runs
    # share one.
    latest = written[-1]["run"]
    current = sum(r["run"] == latest for r in rows.values())
    stale = len(rows) - current
    if not (0 < current < len(rows)) or index.current != current:
        failures.append(f"two runs: {index.current} rows rendered current, {current} in the later run of {len(rows)}")
    if f"{stale} rows from earlier runs are marked stale" not in index.summary:
        failures.append(f"two runs: the summary does not count {stale} stale rows: {index.summary!r}")
    print(f"two runs: {index.rows} rows, {index.current} current, {index.rows - index.current} stale; summary: {index.summary.strip()}")
    for failure in failures:
        print("FAILED:", failure)
    sys.exit(1 if failures else 0)


def main():
    if sys.argv[1] == "--runs":
        check_runs(*sys.argv[2:4])
    index_dom, page_dom, report_dir = sys.argv[1:4]
    failures = []
    rows = newest_rows(read_rows(report_dir))
    index, page = parse(index_dom), parse(page_dom)
    check_index(index, rows, failures)
    for link in index.links + page.links:
        if not os.path.isfile(os.path.join(report_dir, link)):
            failures.append(f"link {link!r} does not resolve in {report_dir}")
    if page.series != min(page.site_rows, 8) or page.series < 2:
        failures.append(f"page: {page.series} stacked series for {page.site_rows} sites")
    print(f"index: {index.rows} rows, {len(index.links)} links; page: {page.site_rows} sites, {page.series} series, {len(page.links)} links")
    for failure in failures:
        print("FAILED:", failure)
    sys.exit(1 if failures else 0)


main()
