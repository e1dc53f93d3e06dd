#!/usr/bin/env python3
"""scripts/plot_bench.py on benchmark JSON of each kind of table: one PNG per table, a real PNG
of the plot's size, and a clear error (non-zero exit) on JSON that is not benchmark results.

usage: test_plot_bench.py PLOT_BENCH.py   (ctest: plot_bench)
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          timeout=120)


def main():
    script = sys.argv[1]
    results = []
    for what in ("init", "push", "pull", "push_again", "pull_again"):
        for n, us in ((1000, 0.9), (10000, 0.5), (100000, 0.4), (1000000, 0.45)):
            results.append({"name": f"kv_1x1_keys_{what}_{n}_us_per_key", "value": us,
                            "unit": "us", "baseline": us / 4, "ratio": 0.25,
                            "table": "1x1 growth"})
    results += [
        {"name": "kv_1x1_push_4KiB", "value": 900, "unit": "MB/s", "baseline": 1000,
         "ratio": 0.9, "table": "1x1"},
        {"name": "kv_1x1_pull_64MiB", "value": 2000, "unit": "MB/s", "baseline": 2100,
         "ratio": 0.95, "table": "1x1"},
        {"name": "fp16_encode", "value": 3.5, "unit": "GB/s", "baseline": None, "ratio": None,
         "table": "conversion"},
    ]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "kv_bench.json"
        src.write_text(json.dumps(results))
        out = Path(d) / "plots"
        r = run(script, "--out", str(out), str(src))
        if r.returncode != 0:
            failures.append(f"plot_bench failed: {r.stderr}")
        want = {"1x1_growth.png", "1x1.png", "conversion.png"}
        got = {p.name for p in out.glob("*.png")} if out.exists() else set()
        if got != want:
            failures.append(f"PNGs {sorted(got)}, expected {sorted(want)}")
        for name in sorted(got & want):
            data = (out / name).read_bytes()
            if not data.startswith(PNG_MAGIC) or len(data) < 5000:
                failures.append(f"{name}: not a plot ({len(data)} bytes)")
        printed = set(Path(line).name for line in r.stdout.split())
        if printed != want:
            failures.append(f"printed {sorted(printed)}, expected the files written")

        bad = Path(d) / "bad.json"
        bad.write_text('{"not": "a list"}')
        r = run(script, "--out", str(out), str(bad))
        if r.returncode == 0 or "not a list of results" not in r.stderr:
            failures.append(f"bad JSON accepted: rc {r.returncode}, {r.stderr!r}")
    for f in failures:
        print("FAILED:", f)
    print("plot_bench:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
