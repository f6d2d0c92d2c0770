#!/usr/bin/env python3
"""The King James Bible as plain text, for tools/train_tiny.py --extra-data.

The text comes from Debian's `bible-kjv` package (public domain): its `bible` program prints every verse
with its number and wraps lines; this keeps one verse per line, without numbers, and a "Book N:" line before
each chapter:

    apt-get install bible-kjv
    bible "gen1:1-rev22:21" | python3 tools/kjv_text.py > .data/kjv.txt     # 4,153,205 characters
"""
import re
import sys


def main():
    out, cur = [], None
    for line in sys.stdin.read().split("\n"):
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m:  # a verse starts
            if cur:
                out.append(cur)
            cur = m.group(2).strip()
        elif not line.strip():  # the end of a chapter
            if cur:
                out.append(cur)
            cur = None
        elif cur is None and re.match(r"^[1-3]?\s?[A-Z][A-Za-z ]+ \d+$", line.strip()):  # "Genesis 1"
            out.append("\n" + line.strip() + ":")
        elif cur is not None:  # a wrapped verse continues
            cur += " " + line.strip()
        else:
            out.append(line.strip())
    if cur:
        out.append(cur)
    sys.stdout.write("\n".join(out).strip() + "\n")


if __name__ == "__main__":
    main()
