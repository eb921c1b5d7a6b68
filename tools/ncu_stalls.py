"""Top stalled SASS instructions of an ncu source page: ``ncu --import R.ncu-rep --page source
--print-source sass --csv > S.csv; python tools/ncu_stalls.py S.csv [TOP]``. Prints the CSV's
stall columns, then the TOP instructions by warp stall samples (all samples) with every nonzero
stall column, and the samples summed per opcode."""

import csv
import sys
from collections import Counter


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top=30):
    with open(path, newline="") as fh:
        lines = fh.read().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"Address"'))  # skip ncu's banner lines
    rows = [{k: v for k, v in r.items() if k is not None} for r in csv.DictReader(lines[start:])]
    if not rows:
        print("no rows")
        return
    cols = list(rows[0].keys())
    stall = [c for c in cols if "stall" in c.lower() or "sampl" in c.lower()]
    print("stall columns:", stall)
    key = next((c for c in stall if "All Samples" in c), stall[0] if stall else None)
    src = next((c for c in cols if c.lower() == "source"), cols[1])
    total = sum(num(r[key]) for r in rows)
    print(f"total samples ({key}): {total:.0f}")
    per_op = Counter()
    for r in rows:
        op = r[src].split()
        op = op[1] if op and op[0].startswith("@") and len(op) > 1 else (op[0] if op else "?")
        per_op[op.split(".")[0]] += num(r[key])
    print("per opcode:", ", ".join(f"{k} {v / total:.1%}" for k, v in per_op.most_common(15)))
    for r in sorted(rows, key=lambda r: -num(r[key]))[:top]:
        extra = {c: r[c] for c in stall if c != key and num(r[c])}
        print(f"{num(r[key]) / total:6.1%} {r.get('Address', '')} {r[src][:60]:60s} {extra}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
