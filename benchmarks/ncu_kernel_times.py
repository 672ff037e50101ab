"""Each kernel's duration in the last of several identical rounds of launches.

Profile a driver that repeats the same work ``--rounds`` times (the first compiles), with one
metric, then summarise the last round::

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        python3 benchmarks/profile_selective_scan.py bfloat16 2 1536 32768 16 > k.csv
    python3 benchmarks/ncu_kernel_times.py k.csv --rounds 2

Prints one line per launch (microseconds, kernel name cut at its parameter list) and the total.
"""
from __future__ import annotations

import argparse
import csv


def launches(path):
    """[(kernel name, microseconds)] in launch order, from ncu's --csv page."""
    out = []
    head = None
    for row in csv.reader(open(path)):
        if head is None:
            if "Metric Name" in row and "Kernel Name" in row:
                head = {k: i for i, k in enumerate(row)}
            continue
        if len(row) < len(head) or row[head["Metric Name"]] != "gpu__time_duration.sum":
            continue
        value = float(row[head["Metric Value"]].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[row[head["Metric Unit"]]]
        out.append((row[head["Kernel Name"]], value * scale))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--rounds", type=int, default=2, help="identical rounds in the profile")
    args = ap.parse_args()
    rows = launches(args.csv)
    last = rows[len(rows) - len(rows) // args.rounds:]
    for name, us in last:
        print(f"{us:9.1f} us  {name.split('(')[0][:100]}")
    print(f"{sum(us for _, us in last):9.1f} us  total ({len(last)} launches)")


if __name__ == "__main__":
    main()
