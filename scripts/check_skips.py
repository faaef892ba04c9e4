#!/usr/bin/python3
"""Lists every test a CTest run skipped, with its reason, and fails on a skip CI does not allow.

    /usr/bin/python3 scripts/check_skips.py [JUNIT] [--allowed FILE]
        JUNIT   CTest's JUnit report (default build/ctest-junit.xml, written by scripts/test.sh)
        FILE    the allowed skips (default tests/allowed_skips.txt)

A skip is allowed when its reason is one of the device messages below (the test needs a GPU,
or needs there to be none), or when the test and its reason are listed in FILE: one entry a
line, the test's name, then the reason it prints ('*' matches anything in either; '#' starts
a comment). Any other skip fails the run: something the test needs is missing.

Where CTest records a skip: a GoogleTest test (gtest_discover_tests) that calls GTEST_SKIP is
"notrun" with message SKIP_REGULAR_EXPRESSION_MATCHED and the reason in its output after the
"file:line: Skipped" line; a script that exits 77 (SKIP_RETURN_CODE) is "notrun" with message
SKIP_RETURN_CODE=77 and prints "SKIP: <reason>"; a DISABLED test is "disabled". A GTEST_SKIP in
a global test environment's SetUp runs no test yet reports success, so CTest calls it passed:
such output counts as a skip here too.
"""

import argparse
import fnmatch
import os
import re
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

# The exact reasons the GPU tests give (GTEST_SKIP() << "..."), matched whole: a reason that
# only mentions CUDA is not one of them.
NEEDS_A_GPU = {
    "no CUDA device",        # the test needs a CUDA device
    "built without CUDA",    # the same test in a build without the (optional) CUDA toolkit
}
NEEDS_NO_GPU = {
    "a CUDA device is present",  # the test checks behaviour without a device
    "a GPU is present",
}

GTEST_SKIPPED = re.compile(r"^\S[^\n]*:\d+: Skipped$", re.M)


def gtest_reason(output):
    """The message after gtest's first "file:line: Skipped" line, or None when there is none."""
    m = GTEST_SKIPPED.search(output)
    if not m:
        return None
    lines = []
    for line in output[m.end():].lstrip("\n").splitlines():
        if not line.strip() or line.startswith("["):
            break
        if not lines or lines[-1] != line.strip():  # a global set-up skip prints it twice
            lines.append(line.strip())
    return " ".join(lines)


def script_reason(output):
    found = re.findall(r"^SKIP: (.+)$", output, re.M)
    return found[-1].strip() if found else None


class Skip:
    def __init__(self, name, reason, how):
        self.name, self.reason, self.how = name, reason, how


def skips_in(junit):
    """Every skipped test of a CTest JUnit report."""
    skips = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name, status = case.get("name", "?"), case.get("status", "")
        output = "".join(e.text or "" for e in case.iter("system-out"))
        skipped = case.find("skipped")
        if status == "disabled":
            skips.append(Skip(name, "disabled", "DISABLED"))
        elif status == "notrun" and skipped is not None:
            message = skipped.get("message", "")
            if message == "SKIP_REGULAR_EXPRESSION_MATCHED":
                reason = gtest_reason(output)
                skips.append(Skip(name, reason if reason else "(GTEST_SKIP without a message)", "GTEST_SKIP"))
            elif message.startswith("SKIP_RETURN_CODE"):
                reason = script_reason(output)
                skips.append(Skip(name, reason or "(exited 77 without printing a 'SKIP: <reason>' line)",
                                  "exit 77"))
            else:
                detail = ": ".join(part for part in (message, output.strip()) if part)
                skips.append(Skip(name, detail or "(no reason recorded)", "not run"))
        elif status == "run":
            reason = gtest_reason(output)
            if reason is not None:
                skips.append(Skip(name, reason or "(GTEST_SKIP without a message)",
                                  "GTEST_SKIP in a global test environment, reported as passed"))
    return skips


def read_allowed(path):
    """[(name pattern, reason pattern, line number)]."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 1)
            if len(parts) < 2:
                raise SystemExit(f"check_skips: {path}:{number}: a test name and the reason it skips "
                                 f"are needed, got {line!r}")
            entries.append((parts[0], parts[1].strip(), number))
    return entries


def shown(path):
    """A path as the repository's own files are usually named: relative to its root."""
    path = os.path.realpath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("junit", nargs="?", default=os.path.join(ROOT, "build", "ctest-junit.xml"))
    parser.add_argument("--allowed", default=os.path.join(ROOT, "tests", "allowed_skips.txt"))
    args = parser.parse_args()
    if not os.path.isfile(args.junit):
        print(f"check_skips: no JUnit report at {args.junit} (scripts/test.sh writes it)", file=sys.stderr)
        return 2
    allowed = read_allowed(args.allowed)
    skips = skips_in(args.junit)
    total = sum(1 for _ in ET.parse(args.junit).getroot().iter("testcase"))

    refused = []
    print(f"check_skips: {len(skips)} of {total} tests skipped")
    for skip in sorted(skips, key=lambda s: s.name):
        if skip.reason in NEEDS_A_GPU:
            verdict = "needs a GPU"
        elif skip.reason in NEEDS_NO_GPU:
            verdict = "needs a machine without a GPU"
        else:
            entry = next((e for e in allowed if fnmatch.fnmatchcase(skip.name, e[0])
                          and fnmatch.fnmatchcase(skip.reason, e[1])), None)
            verdict = f"allowed by {shown(args.allowed)}:{entry[2]}" if entry else "NOT ALLOWED"
        print(f"  {skip.name}: {skip.reason} [{skip.how}; {verdict}]")
        if verdict == "NOT ALLOWED":
            refused.append(skip)
    sys.stdout.flush()
    if refused:
        for skip in refused:
            print(f"check_skips: {skip.name} skipped: {skip.reason}. Only tests that need a GPU may skip "
                  f"in CI: install what it needs (scripts/debian-packages.txt, scripts/pytools-requirements.txt) "
                  f"or, if it cannot run on this kind of machine, list it with its reason in "
                  f"{shown(args.allowed)}", file=sys.stderr)
        print(f"check_skips: FAILED, {len(refused)} skip(s) not allowed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
