#!/usr/bin/python3
"""Fails when a build or its tests used a file that the project's set-up does not install.

    /usr/bin/python3 scripts/check_closure.py [BUILD_DIR ...]      (default: build/)

Collects every file outside the repository that configure, the build and the tests used:

  * the absolute paths in BUILD_DIR/CMakeCache.txt;
  * the CMake files configure read (the implicit inputs of build.ninja's RERUN_CMAKE edge) and
    the files the package configuration files among them name;
  * the headers in ninja's dependency log (`ninja -t deps`);
  * the shared libraries every executable and shared library under BUILD_DIR loads (`ldd`);
  * the modules the Python scripts of the tests import, resolved by the interpreter that runs
    them: the one a CTest command names, CMake's Python for docs/, the tools environment
    ($EMBER_PYTOOLS, default ~/.cache/ember-pytools) for tests/.

Each file is mapped to the Debian package that owns it (dpkg's file lists, read once, with
symbolic links followed hop by hop and /lib and /usr/lib taken as one directory). A package
must be listed in scripts/debian-packages.txt or be in the Depends/Pre-Depends closure of that
list (`apt-cache depends --recurse`, no Recommends or Suggests; of alternatives and of a virtual
package's providers, those installed count, else the first), together with what every Debian
system has (Essential packages and apt). A module from the tools environment must be pinned in
scripts/pytools-requirements.txt. Files no package owns fail too, except in the repository, in
the build trees, in the tools environment and in UNOWNED_ALLOWED below.

Exit status: 0 when everything is covered, 1 with one line per finding, 2 on bad usage.
--packages and --requirements point the check at other lists (its test uses --packages);
--print-closure prints the closure of the package list and exits.
"""

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
DPKG_INFO = "/var/lib/dpkg/info"
DPKG_STATUS = "/var/lib/dpkg/status"

# Files that no Debian package owns and that a build may still use, with why. Paths are
# prefixes: "/usr/local/cuda" also covers the versioned /usr/local/cuda-12.x it links to.
UNOWNED_ALLOWED = (
    ("/usr/local/cuda", "the CUDA toolkit: optional, not installed by scripts/install_deps.sh (README)"),
    # Only bench_gemm_libs uses them, in builds configured with -DEMBER_BENCH_LIBS_DIR.
    (os.path.realpath(os.environ.get("EMBER_BENCH_LIBS")
                      or os.path.join(os.path.expanduser("~"), ".cache", "ember-bench-libs")),
     "MKL and oneDNN from PyPI for bench_gemm_libs: optional, scripts/install_bench_libs.sh"),
)
# Kernel interfaces, not files a package could provide.
PSEUDO_FILESYSTEMS = ("/dev/", "/proc/", "/sys/")
# Directories that Debian creates without listing them in any package (base-files' postinst).
UNLISTED_SYSTEM_DIR = re.compile(r"^/usr/local(/[^/]+)?$")
# Debian 12 merges /bin, /sbin and /lib* into /usr, but dpkg still lists files where the
# package put them.
MERGED_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def allowed_reason(path, real):
    """Why UNOWNED_ALLOWED lets `path` (resolving to `real`) be used, or None."""
    return next((why for prefix, why in UNOWNED_ALLOWED if path.startswith(prefix) or real.startswith(prefix)), None)


# A machine may put `exec /usr/local/cuda-13.0/bin/nvcc "$@"` in /usr/local/bin/nvcc: such a
# wrapper is as allowed as the program it runs, and no more.
EXEC_LINE = re.compile(r'^\s*exec\s+(/\S+)\s+"\$@"\s*$')


def exec_wrapper_target(path):
    """The absolute program a small shell wrapper `path` execs into, or None."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > 4096:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line for line in f.read().splitlines() if line.strip() and not line.lstrip().startswith("#")]
        with open(path, "rb") as f:
            if not f.read(2) == b"#!":
                return None
    except OSError:
        return None
    found = EXEC_LINE.match(lines[0]) if len(lines) == 1 else None
    return found.group(1) if found else None


class Unusable(Exception):
    """The build directory cannot be checked (exit status 2)."""


def read_list(path):
    """Names one a line; '#' starts a comment."""
    with open(path, encoding="utf-8") as f:
        return [n for n in (line.split("#", 1)[0].strip() for line in f) if n]


def normalize_dist(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def bare_package(name):
    """'<python3:any>' -> 'python3'; 'libc6:amd64' -> 'libc6'."""
    return name.strip().strip("<>").split(":", 1)[0]


def under(path, prefix):
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


# ---------------------------------------------------------------------------------------------
# Debian: who owns a file, what is installed, what the package list pulls in.

class Dpkg:
    def __init__(self):
        self.owners = {}
        for entry in os.scandir(DPKG_INFO):
            if not entry.name.endswith(".list"):
                continue
            package = bare_package(entry.name[: -len(".list")])
            with open(entry.path, encoding="utf-8", errors="surrogateescape") as f:
                for line in f:
                    path = line.rstrip("\n")
                    known = self.owners.get(path)
                    if known is None:
                        self.owners[path] = package
                    elif isinstance(known, str):
                        if known != package:
                            self.owners[path] = {known, package}
                    else:
                        known.add(package)
        self.installed, self.essential, self.providers = set(), set(), {}
        for stanza in open(DPKG_STATUS, encoding="utf-8", errors="replace").read().split("\n\n"):
            fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", stanza, re.M))
            if not fields.get("Package") or not fields.get("Status", "").endswith(" installed"):
                continue
            package = fields["Package"]
            self.installed.add(package)
            if fields.get("Essential") == "yes":
                self.essential.add(package)
            for provided in fields.get("Provides", "").split(","):
                if provided.strip():
                    self.providers.setdefault(bare_package(provided.split("(")[0]), set()).add(package)

    def owners_of(self, path):
        found = self.owners.get(path)
        if found is None:
            return set()
        return {found} if isinstance(found, str) else set(found)


def merged_aliases(path):
    """The path and its twin across the /usr merge."""
    parts = path.split("/", 3)  # '', 'usr', 'lib', rest
    if len(parts) >= 3 and parts[1] == "usr" and parts[2] in MERGED_DIRS:
        return [path, path[len("/usr"):]]
    if len(parts) >= 2 and parts[1] in MERGED_DIRS:
        return [path, "/usr" + path]
    return [path]


def link_hops(path):
    """The path, each symbolic link it leads through, and where it ends."""
    hops, current = [], path
    for _ in range(40):
        hops.append(current)
        if not os.path.islink(current):
            break
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    real = os.path.realpath(path)
    if real not in hops:
        hops.append(real)
    return hops


def hop_owners(dpkg, path):
    """[(hop, owners)] for each hop of `path` that some package lists."""
    result = []
    for hop in link_hops(path):
        names = {hop, os.path.join(os.path.realpath(os.path.dirname(hop)), os.path.basename(hop))}
        owners = set()
        for name in names:
            for alias in merged_aliases(name):
                owners |= dpkg.owners_of(alias)
        if owners:
            result.append((hop, owners))
    return result


def package_closure(dpkg, packages):
    """Every package that installing `packages` (without Recommends) brings, on this system."""
    roots = sorted(set(packages) | dpkg.essential | {"apt"})
    out = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
         "--no-breaks", "--no-replaces", "--no-enhances", *roots],
        check=False, capture_output=True, text=True).stdout
    graph, virtual = {}, set()
    groups, group, alternative = None, [], None
    for line in out.splitlines():
        if not line.startswith(" "):
            name = bare_package(line)
            if line.startswith("<") and ":" not in line:  # <python3:any> is the real python3
                virtual.add(name)
            groups = graph.setdefault(name, [])
            group = []
            continue
        m = re.match(r"^ ([ |])(?:Pre)?Depends: (\S+)$", line)
        if m and groups is not None:
            alternative = (bare_package(m.group(2)), [])
            group.append(alternative)
            if m.group(1) == " ":  # the last alternative of its group
                groups.append(group)
                group = []
            continue
        m = re.match(r"^ {4}(\S+)$", line)
        if m and alternative is not None:
            alternative[1].append(bare_package(m.group(1)))

    def installed_among(name, providers):
        found = {name} if name in dpkg.installed else set()
        return found | {p for p in providers if p in dpkg.installed} | dpkg.providers.get(name, set())

    closure, queue = set(), list(roots)
    while queue:
        package = queue.pop()
        if package in closure:
            continue
        closure.add(package)
        if package not in dpkg.installed:
            queue.extend(dpkg.providers.get(package, ()))
        for alternatives in graph.get(package, []):
            chosen = set()
            for name, providers in alternatives:
                chosen |= installed_among(name, providers)
            if not chosen:  # what apt would pick on a fresh system
                name, providers = alternatives[0]
                chosen = set(providers[:1]) if name in virtual else {name}
            queue.extend(chosen - closure)
    return closure


# ---------------------------------------------------------------------------------------------
# What the build used.

class Uses:
    """Absolute path -> where it was seen (the first few places) and what kind of use it was."""

    def __init__(self):
        self.paths, self.kinds = {}, {}

    def add(self, path, source, kind):
        where = self.paths.setdefault(path, [])
        self.kinds.setdefault(path, kind)
        if len(where) < 2:
            where.append(source)


ABSOLUTE_PATH = re.compile(r"(?<![^\s;=\[\](\"'<>,])(?:-[IL])?(/[^\s;\[\]()\"'<>,]+)")


def cmake_cache(build):
    entries = {}
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"^([^#/][^:=]*)(?::[A-Z]+)?=(.*)$", line.rstrip("\n"))
            if m:
                entries[m.group(1)] = m.group(2)
    return entries


def collect_cache(build, entries, uses):
    for key, value in entries.items():
        for m in ABSOLUTE_PATH.finditer(value):
            path = os.path.normpath(m.group(1))
            if os.path.lexists(path):
                uses.add(path, f"{build}/CMakeCache.txt: {key}", "in the CMake cache")


def ninja_unescape(text):
    return re.sub(r"\$([ :$])", r"\1", text)


def collect_configure_inputs(build, cmake_root, uses):
    """The files configure read, and the files named in the package files among them."""
    ninja = os.path.join(build, "build.ninja")
    if not os.path.isfile(ninja):
        raise Unusable(f"{ninja} does not exist (configure {build} with -G Ninja)")
    with open(ninja, encoding="utf-8", errors="replace") as f:
        text = f.read().replace("$\n", " ")
    m = re.search(r"^build build\.ninja[^\n]*?: RERUN_CMAKE([^\n]*)$", text, re.M)
    if not m:
        raise Unusable(f"{ninja} has no RERUN_CMAKE edge (not written by CMake?)")
    inputs = m.group(1).split("||")[0]
    inputs = inputs.split("|", 1)[1] if "|" in inputs else inputs
    package_files = []
    for token in re.split(r"(?<!\$) +", inputs.strip()):
        if not token:
            continue
        path = os.path.normpath(os.path.join(build, ninja_unescape(token)))
        uses.add(path, f"read by configure of {build}", "read by configure")
        if cmake_root and under(path, cmake_root):
            continue  # CMake's own modules name many paths they only try
        package_files.append(path)
    for package_file in package_files:
        if under(package_file, ROOT) or under(package_file, build) or not os.path.isfile(package_file):
            continue
        with open(package_file, encoding="utf-8", errors="replace") as f:
            for named in re.findall(r"(?<![\w}.$/-])(/(?:usr|opt|lib|lib64|etc|root|home|srv|var)/[\w.+@/-]*\w)", f.read()):
                if os.path.isfile(named):
                    uses.add(os.path.normpath(named), f"named in {package_file}", "read by configure")


def collect_headers(build, uses):
    out = subprocess.run(["ninja", "-C", build, "-t", "deps"], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        raise Unusable(f"`ninja -C {build} -t deps` failed: {out.stderr.strip()}")
    target, seen = None, set()
    for line in out.stdout.splitlines():
        if line.startswith("    "):
            dep = line.strip()
            if dep in seen:
                continue
            seen.add(dep)
            uses.add(os.path.normpath(os.path.join(build, dep)), f"header of {target}", "headers")
        elif line and not line.startswith(" ") and ": #deps" in line:
            target = os.path.join(build, line.split(": #deps", 1)[0])


def elf_files(build):
    found = []
    for directory, subdirs, files in os.walk(build):
        subdirs[:] = [d for d in subdirs if d not in ("CMakeFiles", "Testing", "corpus", "crashes")]
        for name in files:
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
                if not (st.st_mode & 0o100000) or os.path.islink(path):
                    continue
                if not (st.st_mode & 0o111 or ".so" in name):
                    continue
                with open(path, "rb") as f:
                    if f.read(4) == b"\x7fELF":
                        found.append(path)
            except OSError:
                continue
    return sorted(found)


def ldd(paths):
    out = subprocess.run(["ldd", *paths], check=False, capture_output=True, text=True).stdout
    result, current = {p: [] for p in paths}, paths[0] if len(paths) == 1 else None
    for line in out.splitlines():
        if not line.startswith("\t"):
            if line.endswith(":") and line[:-1] in result:
                current = line[:-1]
            continue
        if current is not None:
            result[current].append(line.strip())
    return result


def collect_libraries(build, uses, problems):
    binaries = elf_files(build)
    chunks = [binaries[i:i + 32] for i in range(0, len(binaries), 32)]
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for result in pool.map(ldd, chunks):
            for binary, lines in result.items():
                for entry in lines:
                    if "=> not found" in entry:
                        problems.append(f"{binary} needs {entry.split()[0]}, which the loader does not find")
                        continue
                    m = re.search(r"(?:=> )?(/\S+) \(0x", entry)
                    if m:
                        uses.add(os.path.normpath(m.group(1)), f"loaded by {binary}", "shared libraries")
    return len(binaries)


# ---------------------------------------------------------------------------------------------
# The tests' Python.

PROBE = r"""
import importlib.metadata, importlib.util, json, sys
names = json.loads(sys.stdin.read())
try:
    dists = importlib.metadata.packages_distributions()
except Exception:
    dists = {}
result = {"prefix": sys.prefix, "base_prefix": sys.base_prefix, "modules": {}}
for name in names:
    if name in sys.builtin_module_names:
        result["modules"][name] = {"kind": "builtin"}
        continue
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        spec = None
    if spec is None:
        result["modules"][name] = {"kind": "missing"}
        continue
    if spec.origin in (None, "frozen", "built-in") and not spec.submodule_search_locations:
        result["modules"][name] = {"kind": "builtin"}
        continue
    files = [spec.origin] if spec.has_location and spec.origin else []
    files += list(spec.submodule_search_locations or [])[:1]
    versions = {}
    for dist in dists.get(name, []):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except Exception:
            pass
    result["modules"][name] = {"kind": "file", "path": files[0] if files else None, "dists": versions}
print(json.dumps(result))
"""

CATCHES_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def imports_of(script):
    """Top-level module name -> whether every import of it is optional (inside a try that
    catches ImportError)."""
    with open(script, "rb") as f:
        tree = ast.parse(f.read(), script)
    found = {}

    def add(name, optional):
        found[name] = found.get(name, True) and optional

    def catches(handler):
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        return any(isinstance(t, ast.Name) and t.id in CATCHES_IMPORT_ERROR for t in types)

    def visit(node, optional):
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            guarded = optional or any(catches(h) for h in node.handlers)
            for child in node.body:
                visit(child, guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, optional)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name.split(".")[0], optional)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            add(node.module.split(".")[0], optional)
        for child in ast.iter_child_nodes(node):
            visit(child, optional)

    visit(tree, False)
    found.pop("__future__", None)
    return found


def ctest_python_commands(build):
    """[(interpreter, script, test)] for each CTest command that runs a Python script."""
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], check=False,
                         capture_output=True, text=True)
    if out.returncode != 0:
        return []
    try:
        tests = json.loads(out.stdout).get("tests", [])
    except json.JSONDecodeError:
        return []
    found = []
    for test in tests:
        command = test.get("command") or []
        if command and re.fullmatch(r"python[0-9.]*", os.path.basename(command[0])):
            for arg in command[1:]:
                if arg.endswith(".py") and os.path.isfile(arg):
                    found.append((command[0], os.path.realpath(arg), test.get("name", "?")))
    return found


def python_scripts(build, cache, pytools):
    """interpreter -> {script: who runs it}."""
    runs = {}
    named = set()
    for interpreter, script, test in ctest_python_commands(build):
        runs.setdefault(interpreter, {})[script] = f"run by the test {test}"
        named.add(script)
    cmake_python = cache.get("Python3_EXECUTABLE") or cache.get("_Python3_EXECUTABLE")
    tools_python = os.path.join(pytools, "bin", "python")
    for folder, interpreter, who in (("tests", tools_python, "a test script, run with the tools environment"),
                                      ("docs", cmake_python, "run by the docs build with CMake's Python")):
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(files):
                script = os.path.realpath(os.path.join(directory, name))
                if name.endswith(".py") and script not in named and interpreter:
                    runs.setdefault(interpreter, {})[script] = who
    return runs


def collect_python(build, cache, pytools, pinned, uses, problems):
    count = 0
    for interpreter, scripts in sorted(python_scripts(build, cache, pytools).items()):
        if not os.path.exists(interpreter):
            problems.append(f"{interpreter} does not exist, and it runs {', '.join(sorted(scripts))}"
                            + (" (run scripts/install_deps.sh)" if under(interpreter, pytools) else ""))
            continue
        runner = f"the Python that runs {shown(next(iter(scripts)))}"
        uses.add(interpreter, runner, "Python files")
        uses.add(os.path.realpath(interpreter), runner, "Python files")  # a virtual environment's base
        wanted = {}
        for script in scripts:
            local = os.path.dirname(script)
            for module, optional in imports_of(script).items():
                if os.path.exists(os.path.join(local, module + ".py")) or os.path.isdir(os.path.join(local, module)):
                    continue
                wanted.setdefault(module, []).append((script, optional))
        out = subprocess.run([interpreter, "-c", PROBE], input=json.dumps(sorted(wanted)), check=False,
                             capture_output=True, text=True)
        if out.returncode != 0:
            problems.append(f"{interpreter} could not resolve the tests' imports: {out.stderr.strip()[-400:]}")
            continue
        probe = json.loads(out.stdout)
        environment = probe["prefix"] if probe["prefix"] != probe["base_prefix"] else None
        for module, info in sorted(probe["modules"].items()):
            script, optional = wanted[module][0]
            who = f"imported by {shown(script)} ({interpreter})"
            if info["kind"] == "builtin":
                continue
            if info["kind"] == "missing":
                if not all(opt for _, opt in wanted[module]):
                    problems.append(f"module {module}, {who}, is not installed: pin it in "
                                    "scripts/pytools-requirements.txt or add its Debian package to "
                                    "scripts/debian-packages.txt")
                continue
            path = info["path"]
            if not path:
                continue
            count += 1
            if environment and under(os.path.realpath(path), os.path.realpath(environment)):
                dists = info["dists"]
                if not any(normalize_dist(d) in pinned for d in dists):
                    spelled = ", ".join(f"{d}=={v}" for d, v in sorted(dists.items())) or "its distribution"
                    problems.append(f"module {module}, {who}, comes from {path}, installed in the tools "
                                    f"environment but not pinned: add {spelled} to scripts/pytools-requirements.txt")
                continue
            uses.add(os.path.normpath(path), f"module {module} {who}", "Python files")
    return count


# ---------------------------------------------------------------------------------------------

def shown(path):
    """A path as the repository's own files are usually named: relative to its root."""
    path = os.path.realpath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("builds", nargs="*", default=[os.path.join(ROOT, "build")], metavar="BUILD_DIR")
    parser.add_argument("--packages", default=os.path.join(ROOT, "scripts", "debian-packages.txt"))
    parser.add_argument("--requirements", default=os.path.join(ROOT, "scripts", "pytools-requirements.txt"))
    parser.add_argument("--pytools", default=os.environ.get("EMBER_PYTOOLS")
                        or os.path.join(os.path.expanduser("~"), ".cache", "ember-pytools"))
    parser.add_argument("--print-closure", action="store_true")
    args = parser.parse_args()
    start = time.monotonic()

    packages = read_list(args.packages)
    pinned = {normalize_dist(r.split("==", 1)[0]) for r in read_list(args.requirements)}
    dpkg = Dpkg()
    closure = package_closure(dpkg, packages)
    if args.print_closure:
        print("\n".join(sorted(closure)))
        return 0

    problems = [f"{p} is listed in {args.packages} but not installed (run scripts/install_deps.sh)"
                for p in packages if p not in dpkg.installed and not dpkg.providers.get(p)]
    uses = Uses()
    builds = [os.path.realpath(b) for b in args.builds]
    binaries = modules = 0
    for build in builds:
        if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
            print(f"check_closure: {build} has no CMakeCache.txt (not a configured build directory)", file=sys.stderr)
            return 2
        cache = cmake_cache(build)
        collect_cache(build, cache, uses)
        try:
            collect_configure_inputs(build, cache.get("CMAKE_ROOT"), uses)
            collect_headers(build, uses)
        except Unusable as e:
            print(f"check_closure: {e}", file=sys.stderr)
            return 2
        binaries += collect_libraries(build, uses, problems)
        modules += collect_python(build, cache, os.path.realpath(args.pytools), pinned, uses, problems)

    trees = [ROOT, *builds, os.path.realpath(args.pytools)]
    missing_packages = {}  # package -> [(path, source)]
    unowned, used_packages, allowed, outside = [], set(), {}, {}
    for path, sources in sorted(uses.paths.items()):
        real = os.path.realpath(path)
        if any(under(path, t) or under(real, t) for t in trees) or path.startswith(PSEUDO_FILESYSTEMS):
            continue
        outside[uses.kinds[path]] = outside.get(uses.kinds[path], 0) + 1
        owned = hop_owners(dpkg, path)
        if not owned:
            reason = allowed_reason(path, real)
            target = exec_wrapper_target(real) if reason is None else None
            if target is not None and allowed_reason(target, os.path.realpath(target)):
                reason = allowed_reason(target, os.path.realpath(target)) + ", through a wrapper script"
            if reason:
                allowed[reason] = allowed.get(reason, 0) + 1
            elif os.path.isdir(real) and UNLISTED_SYSTEM_DIR.match(real):
                continue
            else:
                unowned.append(f"{path} ({sources[0]}) is owned by no Debian package (installed by hand?): "
                               f"use one from a package in {shown(args.packages)} instead, or list it in "
                               "UNOWNED_ALLOWED (scripts/check_closure.py) with the reason")
            continue
        for hop, owners in owned:
            if owners & closure:
                used_packages |= owners & closure
            else:
                key = ", ".join(sorted(owners))
                missing_packages.setdefault(key, []).append((path if hop == path else f"{path} -> {hop}", sources[0]))

    problems += unowned[:10]
    if len(unowned) > 10:
        problems.append(f"... and {len(unowned) - 10} more files that no Debian package owns")
    for owners, files in sorted(missing_packages.items()):
        package = f"the Debian package {owners}, which" if "," not in owners else f"the Debian packages {owners}, which"
        add = owners if "," not in owners else "one of them"
        for path, source in files[:5]:
            problems.append(f"{path} ({source}) comes from {package} {shown(args.packages)} neither lists nor "
                            f"pulls in through Depends/Pre-Depends: add {add} to it")
        if len(files) > 5:
            problems.append(f"... and {len(files) - 5} more files from {owners}")

    seconds = time.monotonic() - start
    if problems:
        sys.stdout.flush()
        for problem in problems:
            print(f"check_closure: {problem}", file=sys.stderr)
        print(f"check_closure: FAILED, {len(problems)} finding(s) ({seconds:.1f} s)", file=sys.stderr)
        return 1
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(outside.items(), key=lambda kv: -kv[1]))
    extra = "".join(f"; {n} of them from {why.split(':')[0]}" for why, n in allowed.items())
    print(f"check_closure: OK: {sum(outside.values())} files outside the repository ({counts}; "
          f"{binaries} binaries read with ldd, {modules} Python modules) come from {len(used_packages)} Debian "
          f"packages, each in {shown(args.packages)} or its Depends/Pre-Depends closure ({len(closure)} "
          f"packages){extra} ({seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
