#!/usr/bin/env python3
"""Turns benchmark JSON (kv_bench, local_bench, device_bench --json FILE) into one PNG per table.

usage: plot_bench.py [--out DIR] FILE.json [FILE.json ...]

Each JSON entry is {"name", "value", "unit", "baseline", "ratio", "table"}. A growth table
("<setup> growth": N single-float keys in one call) becomes a log-log plot of the time per key
against N for init, push and pull (and kv_bench's push_again and pull_again: the call repeated
at once), kvstore's next to the raw TCP baseline's: a flat line is cost linear in the keys. Any
other table becomes bars of the ratio to its baseline (1.0 = as fast as raw TCP; the dashed line
at 0.8 is the target of most cases), or of the values where an entry has no baseline. Needs
matplotlib (Debian: python3-matplotlib, installed by scripts/setup-deps.sh).
"""

import argparse
import json
import os
import re
import sys
from collections import OrderedDict
from pathlib import Path

GROWTH = re.compile(r"_keys_(init|push_again|pull_again|push|pull)_(\d+)_us_per_key$")


def load(files):
    """The entries of every file, grouped by table in first-appearance order."""
    tables = OrderedDict()
    for f in files:
        try:
            entries = json.loads(Path(f).read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"plot_bench: cannot read {f}: {e}")
        if not isinstance(entries, list):
            sys.exit(f"plot_bench: {f} is not a list of results")
        stem = Path(f).stem
        for e in entries:
            if not isinstance(e, dict) or "name" not in e or "value" not in e:
                sys.exit(f"plot_bench: {f}: an entry without name or value: {e!r}")
            table = e.get("table") or stem
            tables.setdefault(table, []).append(e)
    return tables


def file_name(table):
    return re.sub(r"[^A-Za-z0-9]+", "_", table).strip("_") or "table"


def plot_growth(plt, table, entries, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = OrderedDict()
    for e in entries:
        m = GROWTH.search(e["name"])
        if not m:
            continue
        what, n = m.group(1), int(m.group(2))
        series.setdefault(what, []).append((n, e["value"], e.get("baseline")))
    if not series:
        plt.close(fig)
        return False
    for what, points in series.items():
        points.sort()
        ns = [p[0] for p in points]
        line = ax.plot(ns, [p[1] for p in points], marker="o", label=f"kvstore {what}")[0]
        raw = [(p[0], p[2]) for p in points if p[2] is not None and p[2] > 0]
        if raw:
            ax.plot([r[0] for r in raw], [r[1] for r in raw], linestyle="--", marker=".",
                    color=line.get_color(), label=f"raw TCP {what}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys in one call (N)")
    ax.set_ylabel("us per key")
    ax.set_title(f"{table}: time per key (flat = linear cost)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


SUFFIX = re.compile(r"_(ops|GBps|wire_bytes)$")


def one_per_case(entries):
    """A case's op/s and GB/s give the same ratio and its wire bytes another meaning (lower is
    better): one bar per case, its op/s (or GB/s, or whatever it has)."""
    cases = OrderedDict()
    rank = {"ops": 0, "GBps": 1, "wire_bytes": 3}
    for e in entries:
        m = SUFFIX.search(e["name"])
        case = e["name"][: m.start()] if m else e["name"]
        r = rank[m.group(1)] if m else 2
        if case not in cases or r < cases[case][0]:
            cases[case] = (r, e)
    return [(case, e) for case, (r, e) in cases.items() if r < 3]


def label(table, case):
    """The case without the setup prefix every bar of the table shares (kv_1x1_...)."""
    prefix = f"kv_{table}_"
    return case[len(prefix):] if case.startswith(prefix) else case


def plot_bars(plt, table, entries, out):
    with_ratio = [e for e in entries if isinstance(e.get("ratio"), (int, float))]
    cases = one_per_case(with_ratio if with_ratio else entries)
    if not cases:
        return False
    shown = [e for _, e in cases]
    key = "ratio" if with_ratio else "value"
    names = [label(table, c) for c, _ in cases]
    values = [e[key] for e in shown]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5))
    ax.barh(range(len(names)), values)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize="small")
    ax.invert_yaxis()
    if with_ratio:
        ax.axvline(1.0, color="black", linewidth=1)
        ax.axvline(0.8, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("ratio to the baseline in the same run (higher is better)")
    else:
        units = sorted({str(e.get("unit", "")) for e in shown})
        ax.set_xlabel(", ".join(u for u in units if u) or "value")
    ax.set_title(table)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder of the PNGs (default: the first file's)")
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: files only
        import matplotlib.pyplot as plt
    except ImportError:
        # Debian's python3-matplotlib is the system python's: another python3 first on PATH
        # (pyenv, a venv) does not see it, so run again under the system one.
        system = "/usr/bin/python3"
        if Path(system).exists() and Path(sys.executable).resolve() != Path(system).resolve():
            os.execv(system, [system, *sys.argv])
        sys.exit("plot_bench: needs matplotlib (Debian: python3-matplotlib; scripts/setup-deps.sh)")
    out = Path(a.out) if a.out else Path(a.files[0]).parent
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for table, entries in load(a.files).items():
        png = out / f"{file_name(table)}.png"
        plot = plot_growth if table.endswith("growth") else plot_bars
        if plot(plt, table, entries, png):
            written.append(png)
    for w in written:
        print(w)
    if not written:
        sys.exit("plot_bench: no table to plot")


if __name__ == "__main__":
    main()
