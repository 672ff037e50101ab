"""Executed instructions and stall samples of one kernel by CUDA source line.

Build the kernels with line information (``SSMKIT_LINEINFO=1``), profile one launch with
Nsight Compute's source page in its correlated CUDA + SASS view, then summarise::

    SSMKIT_LINEINFO=1 ncu -k regex:NAME --launch-count 1 --section SourceCounters \\
        --section WarpStateStats --page source --print-source cuda,sass --csv \\
        python3 DRIVER.py > src.csv
    python3 benchmarks/ncu_lines.py src.csv [--src cuda_src] [--top 40]

The page lists, file by file, one row per source line (its instructions' counts summed)
followed by that line's SASS rows; the source text is read from ``--src``.
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_sass_summary import num  # noqa: E402  (a page's numbers, "1,234" or "-")


def read_lines(path):
    """{(file, line): (executed warp instructions, stall samples)} from a cuda,sass page."""
    ex, st = collections.Counter(), collections.Counter()
    head, fname = None, "?"
    for r in csv.reader(open(path)):
        if not r:
            continue
        if r[0] == "File Path":
            fname = os.path.basename(r[1])
        elif r[0] == "Line No":
            head = r
        elif head is not None and r[0].isdigit():
            cols = dict(zip(head, r))
            key = (fname, int(r[0]))
            ex[key] += num(cols.get("Instructions Executed", "0"))
            st[key] += num(cols.get("Warp Stall Sampling (All Samples)", "0"))
    return ex, st


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "..", "cuda_src"))
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args(argv)
    ex, st = read_lines(a.csv)
    tot_ex, tot_st = sum(ex.values()) or 1.0, sum(st.values()) or 1.0
    print(f"executed {tot_ex:.0f} warp instructions, {tot_st:.0f} stall samples")
    cache = {}

    def text(f, ln):
        if f not in cache:
            p = os.path.join(a.src, f)
            cache[f] = open(p).read().splitlines() if os.path.isfile(p) else []
        lines = cache[f]
        return lines[ln - 1].strip()[:90] if 0 < ln <= len(lines) else ""

    for title, counter in (("by executed instructions", ex), ("by stall samples", st)):
        print(f"\nlines {title}: executed %, stall %, file:line, source")
        for (f, ln), _ in counter.most_common(a.top):
            print(f"{ex[(f, ln)] / tot_ex * 100:5.1f} {st[(f, ln)] / tot_st * 100:5.1f}  "
                  f"{f}:{ln}  {text(f, ln)}")


if __name__ == "__main__":
    main()
