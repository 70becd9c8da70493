#!/usr/bin/env python3
"""Prints the figures the architecture is held to: fields per type and lines
per function in src/ (the largest of each), the crate root's public names,
and the README's size, and exits 1 where one is over its limit (12 fields,
80 lines, 12 root names, 12 KiB). CI runs it.

    scripts/structure.py

A reader of Rust by braces and indentation, not a parser: it counts what
rustfmt-formatted code looks like, which this repository is.
"""
import pathlib, re, sys

root = pathlib.Path(__file__).resolve().parent.parent
FIELDS, LINES, ROOT_NAMES, README_BYTES = 12, 80, 12, 12 * 1024

def blocks(lines, start):
    """The line index where the block opened on `start` closes."""
    depth = 0
    for i in range(start, len(lines)):
        code = re.sub(r'"(\\.|[^"\\])*"|//.*', '', lines[i])
        depth += code.count('{') - code.count('}')
        if depth <= 0 and '{' in ''.join(lines[start:i + 1]):
            return i
    return len(lines) - 1

types, functions = [], []
for path in sorted((root / 'src').rglob('*.rs')):
    lines = path.read_text().split('\n')
    name = path.relative_to(root)
    for i, line in enumerate(lines):
        m = re.match(r'^(\s*)(pub(\([^)]*\))? )?struct (\w+)[^;(]*\{\s*$', line)
        if m:
            end = blocks(lines, i)
            indent = len(m.group(1)) + 4
            fields = [l for l in lines[i + 1:end] if re.match(r'^ {%d}(pub(\([^)]*\))? )?\w+: ' % indent, l)]
            types.append((len(fields), f'{name}:{i + 1} {m.group(4)}'))
        m = re.match(r'^\s*(pub(\([^)]*\))? )?(const )?(unsafe )?(extern "C" )?fn (\w+)', line)
        if m and not line.rstrip().endswith(';'):
            end = blocks(lines, i)
            functions.append((end - i + 1, f'{name}:{i + 1} {m.group(6)}'))

lib = (root / 'src/lib.rs').read_text()
names = []
for m in re.finditer(r'^pub use ([^;]+);', lib, re.M):
    body = m.group(1)
    names += [n.strip() for n in body[body.find('{') + 1:body.rfind('}')].split(',')] if '{' in body else [body.split('::')[-1]]
lib_lines = lib.split('\n')
for i, line in enumerate(lib_lines):
    m = re.match(r'^pub (?:mod|fn|struct|enum|trait|type|const) (\w+)', line)
    # What a feature turns on is not in a user's build.
    attributes = lib_lines[max(0, i - 4):i]
    if m and not any('cfg(feature' in a for a in attributes):
        names.append(m.group(1))
# The report module is counted apart; a derive and its trait are one name.
names = list(dict.fromkeys(n for n in names if n and not n.startswith('__') and n != 'report'))
readme = (root / 'README.md').stat().st_size

over = []
def show(title, rows, limit, unit):
    rows = sorted(rows, reverse=True)
    print(f'{title}: {sum(1 for n, _ in rows if n > limit)} of {len(rows)} over {limit} {unit}; the largest:')
    for n, where in rows[:5]:
        print(f'  {n:5} {where}')
    over.extend(where for n, where in rows if n > limit)
show('types (fields)', types, FIELDS, 'fields')
show('functions (lines)', functions, LINES, 'lines')
print(f'public names at the crate root, besides report: {len(names)} (goal {ROOT_NAMES}): {", ".join(names)}')
print(f'README.md: {readme} bytes (at most {README_BYTES})')
if readme > README_BYTES:
    sys.exit('README.md is over its size: move a section to docs/')
if over or len(names) > ROOT_NAMES:
    sys.exit(f'{len(over)} types or functions over their limit, {len(names)} root names')
