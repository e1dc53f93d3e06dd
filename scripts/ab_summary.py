#!/usr/bin/env python3
"""Summarizes alternated kv_bench runs of two builds (scripts/bench-ab.sh): for each measurement,
the range of its value and of its ratio to the raw baseline over the base build's runs and over
the head build's, and whether the two ranges overlap (a change that does not separate them is
not shown by these runs; judged from three runs of each up).

    python3 scripts/ab_summary.py --base base_*.json --head head_*.json [--title TEXT]
"""
import argparse
import json
import sys


def load(paths):
    """name -> list of (value, ratio or None, unit) over the runs, in file order."""
    rows = {}
    for p in paths:
        with open(p) as f:
            for r in json.load(f):
                rows.setdefault(r["name"], []).append((r["value"], r.get("ratio"), r.get("unit", "")))
    return rows


def span(xs, fmt):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"


def number(x):
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def verdict(base, head):
    """'higher' / 'lower' when the head's range lies wholly above / below the base's (with at
    least three runs of each: with fewer, two ranges apart say little)."""
    if len(base) < 3 or len(head) < 3:
        return "-"
    if min(head) > max(base):
        return "higher"
    if max(head) < min(base):
        return "lower"
    return "overlap"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", nargs="+", required=True)
    ap.add_argument("--head", nargs="+", required=True)
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv)
    base, head = load(a.base), load(a.head)
    if a.title:
        print(a.title + "\n")
    print("| measurement | unit | base | head | head vs base | base ratio to raw | head ratio to raw |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in sorted(set(base) | set(head)):
        b, h = base.get(name, []), head.get(name, [])
        unit = (b or h)[0][2]
        print(
            f"| {name} | {unit} | {span([v for v, _, _ in b], number)} | "
            f"{span([v for v, _, _ in h], number)} | "
            f"{verdict([v for v, _, _ in b], [v for v, _, _ in h])} | "
            f"{span([r for _, r, _ in b], lambda x: f'{x:.2f}')} | "
            f"{span([r for _, r, _ in h], lambda x: f'{x:.2f}')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
