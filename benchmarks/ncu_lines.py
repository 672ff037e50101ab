"""Executed instructions and stall samples of one kernel by CUDA source line.

Nsight Compute's SASS source page counts per instruction; the binary built with
``-lineinfo`` (``SSMKIT_LINEINFO=1``) says which source line each instruction came
from. This script joins the two, instruction by instruction, and prints the lines
with the most executed instructions and the most stall samples::

    SSMKIT_LINEINFO=1 CUPY_CACHE_DIR=DIR ncu -k regex:NAME --launch-count 1 \\
        --section SourceCounters --section WarpStateStats --page source \\
        --print-source sass --csv python3 DRIVER.py > src.csv
    python3 benchmarks/ncu_lines.py src.csv DIR [--src cuda_src] [--top 40]

DIR is CuPy's kernel cache of that run: the binary whose code matches the page's
instructions is found there. ``--cubin FILE`` gives the binary directly instead.
"""
from __future__ import annotations

import argparse
import collections
import csv
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LOC = re.compile(r'//## File "([^"]+)", line (\d+)')


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(text):
    ops = [o for o in text.split() if not o.startswith("@")]
    return ops[0].split(".")[0] if ops else "?"


def read_page(path):
    """[(sass text, executed, stall samples)] in address order."""
    rows = list(csv.reader(open(path)))
    hi = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
    head, data = rows[hi], rows[hi + 1:]

    def col(name):
        return next((i for i, c in enumerate(head) if c.startswith(name)), None)

    src, ex, st = col("Source"), col("Instructions Executed"), col("Warp Stall Sampling (All")
    return [(r[src], num(r[ex]), num(r[st])) for r in data if len(r) > max(src, ex, st)]


def elf_images(path):
    """The ELF images inside a file (a cubin, or a cache entry with a header before it)."""
    blob = open(path, "rb").read()
    start = blob.find(b"\x7fELF")
    while start >= 0:
        phoff, shoff = struct.unpack_from("<QQ", blob, start + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, start + 0x36)
        size = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
        for k in range(shnum):  # the sections' contents, wherever they lie
            kind, = struct.unpack_from("<I", blob, start + shoff + k * shentsize + 4)
            off, sz = struct.unpack_from("<QQ", blob, start + shoff + k * shentsize + 0x18)
            if kind != 8:  # SHT_NOBITS occupies no bytes
                size = max(size, off + sz)
        end = start + size
        yield blob[start:end]
        start = blob.find(b"\x7fELF", end)


def disassemble(image, nvdisasm):
    """{function section: [(sass text, file, line)]} of one ELF image."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(image)
        f.flush()
        out = subprocess.run([nvdisasm, "-c", "-g", f.name], capture_output=True, text=True)
    funcs, cur, loc = {}, None, ("?", 0)
    for line in out.stdout.splitlines():
        s = line.strip()
        if s.startswith(".text.") and s.endswith(":"):
            cur = funcs.setdefault(s[6:-1], [])
            loc = ("?", 0)
            continue
        m = LOC.search(s)
        if m:
            loc = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = INSN.search(s)
        if m and cur is not None:
            cur.append((m.group(2), *loc))
    return funcs


def match(page, funcs):
    """The function whose opcodes agree best with the page's, and the share that agree."""
    want = [opcode(t) for t, _, _ in page]
    best, score = None, -1.0
    for name, insns in funcs.items():
        if abs(len(insns) - len(want)) > 2:
            continue
        same = sum(a == opcode(b[0]) for a, b in zip(want, insns)) / max(len(want), 1)
        if same > score:
            best, score = name, same
    return best, score


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("cache", nargs="?", help="CuPy kernel cache folder of the profiled run")
    ap.add_argument("--cubin", help="the binary itself")
    ap.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "..", "cuda_src"))
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    a = ap.parse_args(argv)
    page = read_page(a.csv)
    files = [a.cubin] if a.cubin else sorted(glob.glob(os.path.join(a.cache, "**", "*"),
                                                       recursive=True))
    best = (None, -1.0, None)
    for path in files:
        if not os.path.isfile(path):
            continue
        for image in elf_images(path):
            funcs = disassemble(image, a.nvdisasm)
            name, score = match(page, funcs)
            if name and score > best[1]:
                best = (name, score, funcs[name])
    name, score, insns = best
    if name is None:
        sys.exit("no binary in the cache has this kernel's instructions")
    print(f"{name}: {len(page)} instructions, {score:.1%} of the opcodes agree")
    ex, st = collections.Counter(), collections.Counter()
    for (text, e, s), (_, f, ln) in zip(page, insns):
        ex[(f, ln)] += e
        st[(f, ln)] += s
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
