#!/usr/bin/env python3
"""Checks the include graph of include/kvstore against docs/DESIGN.md's "may include" rules.

Every header belongs to a box (its folder; the top-level headers are "base", "options" or "api").
A header may include headers of its own box and of the boxes listed for it below; anything else
is printed as "box: file includes other" and the script exits 1. Keep this table and the
"Folders" section of docs/DESIGN.md saying the same thing.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include" / "kvstore"

BASE = {"error.hpp", "key.hpp", "op.hpp", "fwd.hpp", "node.hpp"}
OPTIONS = {"options.hpp", "impl/options_env.hpp"}

# box -> boxes it may include (its own box always allowed). "api" may include anything.
MAY_INCLUDE = {
    "base": set(),
    "detail": {"base"},
    "engine": {"base", "detail/block_pool.hpp", "detail/prefetch.hpp"},
    "optim": {"base", "detail"},
    "reduce": {"base", "detail", "optim", "device"},
    "device": {"base", "detail", "engine", "reduce", "optim", "options"},
    "wire": {"base", "detail", "optim/slots.hpp"},
    "transport": {"base", "detail", "wire/frame.hpp"},
    "options": {"base", "detail", "transport/security.hpp"},
    "client": {"base", "detail", "optim", "options", "wire", "transport", "engine/key_slot.hpp"},
    "server": {"base", "detail", "optim", "options", "wire", "transport"},
    "rendezvous": {"base", "detail", "options", "wire", "transport"},
    "compat": {"base", "detail", "api", "options", "engine", "optim", "device"},
}


def box_of(rel: str) -> str:
    if rel in BASE:
        return "base"
    if rel in OPTIONS:
        return "options"
    if "/" not in rel:
        return "api"
    return rel.split("/", 1)[0]


def allowed(src_box: str, dst: str) -> bool:
    dst_box = box_of(dst)
    if src_box == "api" or dst_box == src_box:
        return True
    rules = MAY_INCLUDE.get(src_box, set())
    return dst_box in rules or dst in rules


def main() -> int:
    bad = []
    include = re.compile(r'^\s*#\s*include\s*<kvstore/([^>]+)>', re.M)
    for path in sorted(ROOT.rglob("*.hpp")):
        rel = path.relative_to(ROOT).as_posix()
        src_box = box_of(rel)
        for dst in include.findall(path.read_text()):
            if not allowed(src_box, dst):
                bad.append(f"{src_box}: {rel} includes {dst}")
    for line in bad:
        print(line)
    if bad:
        print(f"check_layers: {len(bad)} include(s) against docs/DESIGN.md's rules", file=sys.stderr)
        return 1
    print("check_layers: the include graph follows docs/DESIGN.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
