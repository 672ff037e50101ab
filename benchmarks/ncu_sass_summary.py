"""Summarise an Nsight Compute source page (SASS) of one kernel: executed instructions and
stall samples by opcode, and the 25 instructions with the most stall samples.

    ncu -k regex:NAME --launch-count 1 --section SourceCounters --section WarpStateStats \
        --page source --print-source sass --csv python3 DRIVER.py > src.csv
    python3 benchmarks/ncu_sass_summary.py src.csv
"""
import collections
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main(path):
    rows = list(csv.reader(open(path)))
    hi = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
    head, data = rows[hi], rows[hi + 1:]

    def col(name):
        return next((i for i, c in enumerate(head) if c.startswith(name)), None)

    src, ex, st = col("Source"), col("Instructions Executed"), col("Warp Stall Sampling (All")
    data = [r for r in data if len(r) > max(src, ex, st)]
    tot_ex = sum(num(r[ex]) for r in data) or 1.0
    tot_st = sum(num(r[st]) for r in data) or 1.0
    print(f"executed {tot_ex:.0f} warp instructions, {tot_st:.0f} stall samples")
    by_ex, by_st = collections.Counter(), collections.Counter()
    for r in data:
        ops = [o for o in r[src].split() if not o.startswith("@")]
        op = ops[0].split(".")[0] if ops else "?"
        by_ex[op] += num(r[ex])
        by_st[op] += num(r[st])
    for op, v in by_ex.most_common(25):
        print(f"{op:10s} executed {v / tot_ex * 100:5.1f}%  stall samples {by_st[op] / tot_st * 100:5.1f}%")
    print("instructions with the most stall samples:")
    for r in sorted(data, key=lambda r: -num(r[st]))[:25]:
        print(f"{num(r[st]) / tot_st * 100:5.1f}%  executed {num(r[ex]):>10.0f}  {r[src].strip()[:90]}")


if __name__ == "__main__":
    main(sys.argv[1])
