#!/usr/bin/env python3
"""The walks over many keys keep their prefetches in the compiled program (issue 12).

GCC once dropped every call to a prefetch helper it had not inlined early (a function whose only
effect is a prefetch counts as pure, its unused call as dead): the server's batched push walk and
the client's key lookups ran with no prefetch, and nothing but the disassembly showed it
(detail/prefetch.hpp). This test disassembles a built program and requires a prefetch
instruction in at least one function of each named kind.

usage: test_prefetch_kept.py PROGRAM NAME_REGEX...   (ctest: prefetch_kept)
Exits 77 (skipped) where objdump or a known prefetch instruction is missing.
"""

import re
import shutil
import subprocess
import sys

SKIP = 77
# x86-64 (prefetcht0/t1/t2/nta/w) and AArch64 (prfm).
PREFETCH = re.compile(r"\s(prefetch\w*|prfm)\s")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def functions_with_prefetch(program):
    """Demangled names of the program's functions, each with whether it holds a prefetch."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", program],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    found, name = {}, None
    for line in out.splitlines():
        m = FUNCTION.match(line)
        if m:
            name = m.group(1)
            found.setdefault(name, False)
        elif name and PREFETCH.search(line):
            found[name] = True
    return found


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    program, kinds = sys.argv[1], sys.argv[2:]
    if not shutil.which("objdump"):
        print("objdump not found: skipped")
        return SKIP
    found = functions_with_prefetch(program)
    if not any(found.values()):
        print(f"{program}: no prefetch instruction at all (an unknown architecture?): skipped")
        return SKIP
    failed = False
    for kind in kinds:
        pattern = re.compile(kind)
        matching = [n for n in found if pattern.search(n)]
        kept = [n for n in matching if found[n]]
        print(f"{kind}: {len(matching)} functions, {len(kept)} with a prefetch")
        if not matching:
            print(f"  no function of {program} matches {kind!r}")
            failed = True
        elif not kept:
            print(f"  none of them prefetches: the walk's prefetches were dropped")
            for n in matching[:5]:
                print(f"    {n[:160]}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
