"""Checks report pages as a browser rendered them.

    browser-check.py DUMPED_INDEX DUMPED_PAGE REPORT_DIR

DUMPED_* are the DOMs headless Chromium printed (--dump-dom) for index.html
and a failing test's page in REPORT_DIR. Every row of index.rows must be a
row of the index, every link must resolve to a file in REPORT_DIR, and the
page's chart of retained bytes by site must have one series per site.
"""
import html.parser
import json
import os
import sys


class Collect(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows = 0
        self.links = []
        self.series = 0
        self.site_rows = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "tr" and ({"current", "stale"} & set(classes)):
            self.rows += 1
        if tag == "tr" and "site" in classes:
            self.site_rows += 1
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "polygon" and "site-series" in classes:
            self.series += 1


def parse(path):
    collected = Collect()
    with open(path, encoding="utf-8") as f:
        collected.feed(f.read())
    return collected


def main():
    index_dom, page_dom, report_dir = sys.argv[1:4]
    failures = []
    with open(os.path.join(report_dir, "index.rows"), encoding="utf-8") as f:
        expected_rows = [json.loads(line)["test"] for line in f if line.strip()]
    index, page = parse(index_dom), parse(page_dom)
    if index.rows != len(expected_rows):
        failures.append(f"index: {index.rows} rows rendered, {len(expected_rows)} in index.rows")
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
