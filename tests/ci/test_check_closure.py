#!/usr/bin/python3
"""Tests of scripts/check_closure.py, on fake build directories and on the real one.

    test_check_closure.py outside-package   a cache entry naming a file of an installed package
                                            outside the package list's closure fails, naming
                                            the file and the package; without it, it passes
    test_check_closure.py unowned-file      a cache entry naming a file no package owns fails
    test_check_closure.py exec-wrapper      a compiler that is a one-line `exec PROGRAM "$@"` script
                                            passes when PROGRAM is allowed (the CUDA toolkit) and
                                            fails when PROGRAM is a stray file
    test_check_closure.py this-build DIR    the real build directory passes

Exits 0 on success, 1 on failure, 77 (a skip) when every installed package is in the closure
even of a one-package list, so that no outside package exists to test with.
"""

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
CHECK = [sys.executable, os.path.join(ROOT, "scripts", "check_closure.py")]
DPKG_INFO = "/var/lib/dpkg/info"


def run(*args):
    done = subprocess.run([*CHECK, *args], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def fail(message, output=""):
    print(f"FAIL: {message}\n--- check_closure said:\n{output}")
    sys.exit(1)


def fake_build(directory, entries):
    """A directory that looks like a configured Ninja build to the check."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "CMakeCache.txt"), "w", encoding="utf-8") as f:
        f.write("# This is the CMakeCache file.\n")
        for key, value in entries.items():
            f.write(f"{key}:FILEPATH={value}\n")
    with open(os.path.join(directory, "build.ninja"), "w", encoding="utf-8") as f:
        f.write("rule RERUN_CMAKE\n  command = true\nbuild build.ninja: RERUN_CMAKE | CMakeCache.txt\n")
    return directory


def installed_packages():
    installed = set()
    with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as f:
        for stanza in f.read().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
            if fields.get("Status", "").endswith(" installed") and fields.get("Package"):
                installed.add(fields["Package"])
    return installed


def file_lists():
    """package -> the paths its dpkg file list names; path -> how many packages list it."""
    lists, listed = {}, {}
    for name in os.listdir(DPKG_INFO):
        if name.endswith(".list"):
            package = name[:-len(".list")].split(":", 1)[0]
            with open(os.path.join(DPKG_INFO, name), encoding="utf-8", errors="surrogateescape") as f:
                paths = [line.rstrip("\n") for line in f]
            lists.setdefault(package, []).extend(paths)
            for path in paths:
                listed[path] = listed.get(path, 0) + 1
    return lists, listed


def file_of_a_package_outside(closure, lists, listed):
    """(package, file): an installed package outside `closure` and a regular file only it owns,
    reached without symbolic links."""
    for package in sorted(installed_packages() - closure):
        for path in lists.get(package, []):
            if (path.startswith("/usr/") and listed.get(path) == 1 and os.path.isfile(path)
                    and not os.path.islink(path) and os.path.realpath(path) == path):
                return package, path
    return None


def outside_package():
    lists, listed = file_lists()
    with tempfile.TemporaryDirectory(prefix="ember_closure_") as tmp:
        package_list = os.path.join(ROOT, "scripts", "debian-packages.txt")
        found = None
        # The project's own list first; a machine with nothing but its closure installed is
        # tested with a one-package list instead, whose closure leaves most packages out.
        for candidate_list in (package_list, None):
            if candidate_list is None:
                candidate_list = os.path.join(tmp, "one-package.txt")
                with open(candidate_list, "w", encoding="utf-8") as f:
                    f.write("# only the build tool\nninja-build\n")
            rc, out = run("--packages", candidate_list, "--print-closure")
            if rc != 0:
                fail("--print-closure failed", out)
            found = file_of_a_package_outside(set(out.split()), lists, listed)
            if found:
                package_list = candidate_list
                break
        if not found:
            print("SKIP: every installed package is in the closure even of a one-package list")
            return 77
        package, path = found
        print(f"using {path} from {package}, which the closure of {package_list} leaves out")

        build = fake_build(os.path.join(tmp, "build"), {"CMAKE_MAKE_PROGRAM": "/usr/bin/ninja",
                                                         "EMBER_FAKE_DEPENDENCY": path})
        rc, out = run("--packages", package_list, build)
        if rc != 1:
            fail(f"expected exit status 1 for {path} ({package}), got {rc}", out)
        lines = [line for line in out.splitlines() if path in line]
        if not any(f"comes from the Debian package {package}," in line and f"add {package} to it" in line
                   and "EMBER_FAKE_DEPENDENCY" in line for line in lines):
            fail(f"no finding names {path}, its cache entry and the package {package}", out)

        control = fake_build(os.path.join(tmp, "control"), {"CMAKE_MAKE_PROGRAM": "/usr/bin/ninja"})
        rc, out = run("--packages", package_list, control)
        if rc != 0:
            fail("the same fake build without that entry should pass", out)
    print("ok")
    return 0


def unowned_file():
    with tempfile.TemporaryDirectory(prefix="ember_closure_") as tmp:
        stray = os.path.join(tmp, "hand-installed", "libstray.so")
        os.makedirs(os.path.dirname(stray))
        with open(stray, "wb") as f:
            f.write(b"\x7fELF")
        build = fake_build(os.path.join(tmp, "build"), {"CMAKE_MAKE_PROGRAM": "/usr/bin/ninja",
                                                         "STRAY_LIBRARY": stray})
        rc, out = run(build)
        if rc != 1:
            fail(f"expected exit status 1 for the unowned {stray}, got {rc}", out)
        if not any(stray in line and "is owned by no Debian package" in line for line in out.splitlines()):
            fail(f"no finding says that no package owns {stray}", out)
    print("ok")
    return 0


def write_wrapper(path, target):
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\nexec {target} "$@"\n')
    os.chmod(path, 0o755)


def exec_wrapper():
    with tempfile.TemporaryDirectory(prefix="ember_closure_") as tmp:
        to_cuda, to_stray = os.path.join(tmp, "nvcc"), os.path.join(tmp, "stray-cc")
        write_wrapper(to_cuda, "/usr/local/cuda-13.0/bin/nvcc")
        write_wrapper(to_stray, os.path.join(tmp, "hand-installed", "cc"))
        rc, out = run(fake_build(os.path.join(tmp, "good"), {"CMAKE_MAKE_PROGRAM": "/usr/bin/ninja",
                                                               "CMAKE_CUDA_COMPILER": to_cuda}))
        if rc != 0:
            fail(f"a wrapper that execs the CUDA toolkit's nvcc should pass, got exit status {rc}", out)
        rc, out = run(fake_build(os.path.join(tmp, "bad"), {"CMAKE_MAKE_PROGRAM": "/usr/bin/ninja",
                                                              "CMAKE_CUDA_COMPILER": to_stray}))
        if rc != 1 or not any(to_stray in line and "is owned by no Debian package" in line
                              for line in out.splitlines()):
            fail(f"a wrapper that execs a stray program should fail naming {to_stray}, got {rc}", out)
    print("ok")
    return 0


def this_build(build):
    rc, out = run(build)
    print(out)
    if rc != 0:
        fail(f"{build} does not pass the closure check", out)
    return 0


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "outside-package":
        return outside_package()
    if mode == "unowned-file":
        return unowned_file()
    if mode == "exec-wrapper":
        return exec_wrapper()
    if mode == "this-build" and len(sys.argv) == 3:
        return this_build(sys.argv[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
