#!/usr/bin/env python3
"""scripts/check_layers.py on scratch header trees: a clean tree passes (exit 0); two headers of
one box that include each other fail (exit 1) with the cycle printed as a chain of files; and a
table with a cycle between boxes is found.

usage: test_check_layers.py CHECK_LAYERS.py   (ctest: check_layers)
"""

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path


def write_tree(root, files):
    for rel, includes in files.items():
        path = root / "kvstore" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#pragma once\n" + "".join(f"#include <kvstore/{i}>\n" for i in includes))


def run(script, root):
    return subprocess.run([sys.executable, script, str(root)], capture_output=True, text=True,
                          timeout=120)


def main():
    script = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        clean = Path(d) / "clean"
        write_tree(clean, {"error.hpp": [], "detail/a.hpp": ["error.hpp"],
                           "detail/b.hpp": ["detail/a.hpp", "error.hpp"]})
        r = run(script, clean)
        if r.returncode != 0:
            failures.append(f"clean tree: rc {r.returncode}, {r.stdout!r} {r.stderr!r}")

        cyclic = Path(d) / "cyclic"
        write_tree(cyclic, {"error.hpp": [], "detail/a.hpp": ["detail/b.hpp"],
                            "detail/b.hpp": ["detail/a.hpp", "error.hpp"]})
        r = run(script, cyclic)
        if r.returncode != 1:
            failures.append(f"cyclic tree: rc {r.returncode}, expected 1")
        if "cycle: detail/a.hpp -> detail/b.hpp -> detail/a.hpp" not in r.stdout:
            failures.append(f"cyclic tree: the chain is not printed: {r.stdout!r}")

    spec = importlib.util.spec_from_file_location("check_layers", script)
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    got = layers.find_cycles(layers.box_graph({"reduce": {"base", "device/runtime.hpp"},
                                               "device": {"base", "reduce"}, "base": set()}))
    if got != [["device", "reduce", "device"]]:
        failures.append(f"box cycle: found {got}")
    if layers.find_cycles(layers.box_graph(layers.MAY_INCLUDE)):
        failures.append("the script's own MAY_INCLUDE has a cycle")
    for f in failures:
        print("FAILED:", f)
    print("check_layers:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
