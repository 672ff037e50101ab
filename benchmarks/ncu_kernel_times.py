"""Each kernel's duration (and any other metrics profiled) in the last of several identical
rounds of launches.

Profile a driver that repeats the same work ``--rounds`` times (the first compiles), then
summarise the last round::

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        python3 benchmarks/profile_selective_scan.py bfloat16 2 1536 32768 16 > k.csv
    python3 benchmarks/ncu_kernel_times.py k.csv --rounds 2

Prints one line per launch (microseconds, then the other metrics in the order profiled,
kernel name cut at its parameter list) and the totals.
"""
from __future__ import annotations

import argparse
import csv

_TIME = "gpu__time_duration.sum"
_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def launches(path):
    """[(kernel name, {metric: value})] in launch order (durations in µs), from ncu's --csv page."""
    out, index = [], {}
    head = None
    for row in csv.reader(open(path)):
        if head is None:
            if "Metric Name" in row and "Kernel Name" in row:
                head = {k: i for i, k in enumerate(row)}
            continue
        if len(row) < len(head):
            continue
        launch = row[head["ID"]]
        if launch not in index:
            index[launch] = len(out)
            out.append((row[head["Kernel Name"]], {}))
        name, unit = row[head["Metric Name"]], row[head["Metric Unit"]]
        value = float(row[head["Metric Value"]].replace(",", ""))
        out[index[launch]][1][name] = value * _SCALE[unit] if name == _TIME else value
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--rounds", type=int, default=2, help="identical rounds in the profile")
    args = ap.parse_args()
    rows = launches(args.csv)
    last = rows[len(rows) - len(rows) // args.rounds:]
    others = [m for m in (last[0][1] if last else {}) if m != _TIME]
    if others:
        print("  time us  " + "  ".join(others))
    for name, m in last:
        extra = "".join(f"  {m.get(k, float('nan')):14.0f}" for k in others)
        print(f"{m.get(_TIME, float('nan')):9.1f} us{extra}  {name.split('(')[0][:100]}")
    totals = "".join(f"  {sum(m.get(k, 0.0) for _, m in last):14.0f}" for k in others)
    print(f"{sum(m.get(_TIME, 0.0) for _, m in last):9.1f} us{totals}  total ({len(last)} launches)")


if __name__ == "__main__":
    main()
