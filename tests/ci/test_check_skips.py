#!/usr/bin/python3
"""Tests of scripts/check_skips.py on small JUnit reports shaped like CTest's.

    test_check_skips.py unlisted   a skip that is neither a GPU's nor listed fails the run,
                                   naming the test and its reason
    test_check_skips.py allowed    GPU skips, listed skips and passing tests pass, and the
                                   repository's tests/allowed_skips.txt parses
"""

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
CHECK = [sys.executable, os.path.join(ROOT, "scripts", "check_skips.py")]


def gtest_output(name, reason):
    """What a discovered GoogleTest test prints when it calls GTEST_SKIP() << reason."""
    return (f"Running main() from gtest_main.cc\nNote: Google Test filter = {name}\n"
            f"[==========] Running 1 test from 1 test suite.\n[ RUN      ] {name}\n"
            f"/src/tests/x/test_x.cpp:12: Skipped\n{reason}\n\n[  SKIPPED ] {name} (0 ms)\n")


def environment_skip_output(name, reason):
    """A GTEST_SKIP in a global environment's SetUp: no test runs, and gtest reports success."""
    return (f"Note: Google Test filter = {name}\n[----------] Global test environment set-up.\n"
            f"/src/tests/x/cases.h:43: Skipped\n{reason}\n{reason}\n"
            "[----------] Global test environment tear-down\n[  PASSED  ] 1 test.\n")


GPU = ("Cuda.NeedsADevice", "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED", gtest_output("Cuda.NeedsADevice", "no CUDA device"))
NO_GPU = ("Cuda.WithoutADevice", "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED",
          gtest_output("Cuda.WithoutADevice", "a CUDA device is present"))
LISTED = ("Net.TwoNamespaces", "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED",
          gtest_output("Net.TwoNamespaces", "cannot build the two-namespace network here: Operation not permitted"))
PASSED = ("Ops.Adds", "run", None, "[ RUN      ] Ops.Adds\n[       OK ] Ops.Adds (0 ms)\n")
UNLISTED = ("Plot.Renders", "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED",
            gtest_output("Plot.Renders", "Chromium is not installed (apt-get install chromium)"))
# Mentions CUDA but is not the GPU tests' reason: a missing library, not a missing device.
NEAR_GPU = ("Cuda.Loads", "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED",
            gtest_output("Cuda.Loads", "no CUDA device library libcudart.so.12"))
SCRIPT = ("Interop.Loads", "notrun", "SKIP_RETURN_CODE=77",
          "SKIP: /venv/bin/python cannot import torch, transformers and safetensors\n")
SILENT_SCRIPT = ("Interop.Quiet", "notrun", "SKIP_RETURN_CODE=77", "nothing to say\n")
ENVIRONMENT = ("Gemm.EveryCase", "run", None,
               environment_skip_output("Gemm.EveryCase", "this CPU cannot run the avx512bf16 bf16 GEMM"))

ALLOWED = """# comments and blank lines are ignored

Net.TwoNamespaces   cannot build the two-namespace network here: *
"""


def write_junit(path, cases):
    suite = ET.Element("testsuite", name="(empty)", tests=str(len(cases)))
    for name, status, skip_message, output in cases:
        case = ET.SubElement(suite, "testcase", name=name, classname=name, time="0.01", status=status)
        if skip_message:
            ET.SubElement(case, "skipped", message=skip_message)
        ET.SubElement(case, "system-out").text = output
    ET.ElementTree(suite).write(path, encoding="UTF-8", xml_declaration=True)


def check(tmp, cases, allowed=ALLOWED):
    junit, allowed_file = os.path.join(tmp, "junit.xml"), os.path.join(tmp, "allowed.txt")
    write_junit(junit, cases)
    with open(allowed_file, "w", encoding="utf-8") as f:
        f.write(allowed)
    done = subprocess.run([*CHECK, junit, "--allowed", allowed_file], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def fail(message, *outputs):
    print(f"FAIL: {message}\n--- check_skips said:\n" + "\n".join(outputs))
    sys.exit(1)


def unlisted():
    with tempfile.TemporaryDirectory(prefix="ember_skips_") as tmp:
        rc, out, err = check(tmp, [GPU, LISTED, PASSED, UNLISTED, NEAR_GPU, SCRIPT, SILENT_SCRIPT, ENVIRONMENT])
        if rc != 1:
            fail(f"expected exit status 1, got {rc}", out, err)
        refused = [line for line in err.splitlines() if " skipped: " in line]
        expected = {
            "Plot.Renders": "Chromium is not installed (apt-get install chromium)",
            "Cuda.Loads": "no CUDA device library libcudart.so.12",
            "Interop.Loads": "/venv/bin/python cannot import torch, transformers and safetensors",
            "Interop.Quiet": "exited 77 without printing a 'SKIP: <reason>' line",
            "Gemm.EveryCase": "this CPU cannot run the avx512bf16 bf16 GEMM",
        }
        for name, reason in expected.items():
            if not any(line.startswith(f"check_skips: {name} skipped: ") and reason in line for line in refused):
                fail(f"{name} ({reason}) is not refused", out, err)
        for name in ("Cuda.NeedsADevice", "Net.TwoNamespaces", "Ops.Adds"):
            if any(f" {name} skipped" in line for line in refused):
                fail(f"{name} is refused but is allowed", out, err)
        if f"FAILED, {len(expected)} skip(s) not allowed" not in err:
            fail("the failure does not count the refused skips", out, err)
        # Every skip is listed with its reason, allowed or not.
        for name, reason in [("Cuda.NeedsADevice", "no CUDA device"), *expected.items()]:
            if not any(line.strip().startswith(f"{name}: ") and reason in line for line in out.splitlines()):
                fail(f"{name} is not listed with its reason", out, err)
    print("ok")
    return 0


def allowed():
    with tempfile.TemporaryDirectory(prefix="ember_skips_") as tmp:
        rc, out, err = check(tmp, [GPU, NO_GPU, LISTED, PASSED])
        if rc != 0:
            fail(f"GPU, listed and passing tests should pass, got {rc}", out, err)
        if "3 of 4 tests skipped" not in out or "Net.TwoNamespaces: cannot build" not in out:
            fail("the skips are not listed", out, err)
        # The listed reason must match too: the same test skipping for another reason fails.
        other = ("Net.TwoNamespaces", "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED",
                 gtest_output("Net.TwoNamespaces", "iproute2 (`ip`) is not installed"))
        rc, out, err = check(tmp, [other])
        if rc != 1:
            fail("a listed test skipping for a reason its entry does not give should fail", out, err)
        # The repository's own list parses.
        with open(os.path.join(ROOT, "tests", "allowed_skips.txt"), encoding="utf-8") as f:
            rc, out, err = check(tmp, [GPU, PASSED], allowed=f.read())
        if rc != 0:
            fail("tests/allowed_skips.txt does not parse", out, err)
    print("ok")
    return 0


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "unlisted":
        return unlisted()
    if mode == "allowed":
        return allowed()
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
