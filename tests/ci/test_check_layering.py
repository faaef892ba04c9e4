#!/usr/bin/python3
"""Tests of scripts/check_layering.py, on small fake trees and on this repository.

    test_check_layering.py refusals    every kind of refused include in a fake tree is found,
                                       named by file and line; the allowed ones are not
    test_check_layering.py readme      a README layout table out of rooms.txt's order fails
    test_check_layering.py this-tree   this repository's library passes

Exits 0 on success, 1 on failure.
"""

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
CHECK = [sys.executable, os.path.join(ROOT, "scripts", "check_layering.py")]

ROOMS = """\
# room  level  private
base    0
low     1      hidden.h
side    1
top     2
"""


def run(*args):
    done = subprocess.run([*CHECK, *args], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def fail(message, output=""):
    print(f"FAIL: {message}\n--- check_layering said:\n{output}")
    sys.exit(1)


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def fake_tree(root, readme_rooms=("base", "low", "side", "top")):
    write(root, "rooms.txt", ROOMS)
    write(root, "README.md", "| Folder | What |\n| --- | --- |\n" + "".join(f"| `{r}/` | x |\n" for r in readme_rooms))
    write(root, "base/a.h", "#pragma once\n#include <vector>\n")
    write(root, "low/hidden.h", "#pragma once\n")
    write(root, "low/b.h", '#pragma once\n#include "base/a.h"\n#include "hidden.h"\n')
    write(root, "side/c.h", "#pragma once\n")
    write(root, "tests/t.h", "#pragma once\n")


def refusals():
    with tempfile.TemporaryDirectory(prefix="ember_layering_") as root:
        fake_tree(root)
        rc, out = run("--root", root)
        if rc != 0:
            fail(f"a tree of downward includes should pass, got exit status {rc}", out)
        write(root, "base/up.cpp", '#include "base/a.h"\n\n#include "top/d.h"\n')
        write(root, "top/d.h", '#pragma once\n#include "low/b.h"\n#include "low/hidden.h"\n')
        write(root, "low/sideways.cpp", '#include "side/c.h"\n')
        write(root, "side/tests.cpp", '#include "tests/t.h"\n')
        rc, out = run("--root", root)
        if rc != 1:
            fail(f"expected exit status 1 for refused includes, got {rc}", out)
        expected = [("base/up.cpp:3:", "points above"),
                    ("top/d.h:3:", "private to low"),
                    ("low/sideways.cpp:1:", "points beside"),
                    ("side/tests.cpp:1:", "in no room")]
        lines = out.splitlines()
        for where, why in expected:
            if not any(line.startswith(where) and why in line for line in lines):
                fail(f"no finding `{where} ... {why}`", out)
        findings = [line for line in lines if ": includes " in line]
        if len(findings) != len(expected):
            fail(f"expected {len(expected)} findings, got {len(findings)}", out)
    print("ok")
    return 0


def readme():
    with tempfile.TemporaryDirectory(prefix="ember_layering_") as root:
        fake_tree(root, readme_rooms=("base", "side", "low", "top"))
        rc, out = run("--root", root)
        if rc != 1 or "README.md: the layout table" not in out:
            fail(f"a README table out of order should fail naming README.md, got {rc}", out)
    print("ok")
    return 0


def this_tree():
    rc, out = run()
    print(out)
    if rc != 0:
        fail("this repository's includes do not follow rooms.txt", out)
    return 0


def main():
    modes = {"refusals": refusals, "readme": readme, "this-tree": this_tree}
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode in modes:
        return modes[mode]()
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
