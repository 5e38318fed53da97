#!/usr/bin/env python3
"""Lists the functions of a source tree longer than a limit, longest first.

Usage: scripts/fn-lengths.py [DIR] [LIMIT]   (default: crates/fastudp-cli/src 100)

A function runs from its `fn` line to the closing brace at the same
indentation (rustfmt's layout); the count includes both lines.
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "crates/fastudp-cli/src"
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 100
head = re.compile(r"^(\s*)(pub(\([a-z]+\))? )?(async )?(const )?(unsafe )?fn ([A-Za-z0-9_]+)")
found = []
for d, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".rs"):
            continue
        path = os.path.join(d, f)
        lines = open(path, encoding="utf-8").read().split("\n")
        for i, line in enumerate(lines):
            m = head.match(line)
            if not m:
                continue
            indent = m.group(1)
            for j in range(i, len(lines)):
                if lines[j].rstrip().endswith(";") and j == i:
                    break  # a declaration without a body
                if lines[j] == indent + "}":
                    found.append((j - i + 1, os.path.relpath(path, root), m.group(7)))
                    break
long = sorted((x for x in found if x[0] > limit), reverse=True)
for n, path, name in long:
    print(f"{n:5} {path}::{name}")
print(f"{len(long)} functions over {limit} lines (of {len(found)})")
