#!/usr/bin/python3
"""Checks every #include of the library against the room order in rooms.txt.

    check_layering.py [--root DIR]

DIR (default: this repository) holds rooms.txt and the rooms it names. Each finding is one line,
`file:line: message`, naming the include and why it is refused: it points to a room on the same
level or above, into another room's private files, or to a file of the repository outside every
room (tests/, say). The README's layout table must name the rooms in rooms.txt's order (a table
row per room whose first cell is the room in backquotes, with or without a trailing slash).

Exit status: 0 when every include points down, 1 with findings, 2 on a bad rooms.txt.
"""

import argparse
import fnmatch
import os
import re
import sys

SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc", ".def")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


class BadTable(Exception):
    pass


def read_rooms(path):
    """[(room, level, [private globs])], in the file's order."""
    rooms = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) < 2 or not fields[1].isdigit():
                raise BadTable(f"{path}:{number}: expected `room level [private globs...]`, got {line.strip()!r}")
            rooms.append((fields[0].strip("/"), int(fields[1]), fields[2:]))
    if not rooms:
        raise BadTable(f"{path}: names no rooms")
    levels = [level for _, level, _ in rooms]
    if levels != sorted(levels):
        raise BadTable(f"{path}: rooms must be listed lowest level first")
    return rooms


class Rooms:
    def __init__(self, root, table):
        self.root = root
        self.table = table
        # Longest prefix first, so kernels/cuda wins over a room `kernels`.
        self.by_prefix = sorted(table, key=lambda r: -len(r[0]))

    def room_of(self, relative):
        for room, level, private in self.by_prefix:
            if relative.startswith(room + "/"):
                return room, level, private
        return None

    @staticmethod
    def is_private(relative, room, private):
        inside = relative[len(room) + 1:]
        return any(fnmatch.fnmatch(inside, glob) or fnmatch.fnmatch(os.path.basename(inside), glob)
                   for glob in private)


def resolve(root, including_dir, kind, target):
    """The repository-relative path an include names, or None for a file outside the repository."""
    candidates = []
    if kind == '"':
        candidates.append(os.path.join(including_dir, target))
    candidates.append(os.path.join(root, target))
    if target.startswith("ember/"):
        candidates.append(os.path.join(root, "include", target))
    for candidate in candidates:
        if os.path.isfile(candidate):
            return os.path.relpath(os.path.realpath(candidate), os.path.realpath(root))
    return None


def sources_of(root, room):
    top = os.path.join(root, room)
    for directory, _, files in os.walk(top):
        for name in sorted(files):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.join(directory, name)


def check_includes(rooms):
    findings = []
    for room, level, _ in rooms.table:
        for path in sources_of(rooms.root, room):
            relative = os.path.relpath(path, rooms.root)
            here = rooms.room_of(relative)
            if here is None or here[0] != room:
                continue  # a sub-room listed on its own is checked as itself
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    match = INCLUDE.match(line)
                    if not match:
                        continue
                    target = resolve(rooms.root, os.path.dirname(path), match.group(1), match.group(2))
                    if target is None or target == relative:
                        continue
                    problem = refusal(rooms, room, level, target)
                    if problem:
                        findings.append(f"{relative}:{number}: includes {match.group(2)}: {problem}")
    return findings


def refusal(rooms, room, level, target):
    there = rooms.room_of(target)
    if there is None:
        return f"{target} is in no room of rooms.txt (the library includes only library files)"
    other, other_level, private = there
    if other == room:
        return None
    if other_level >= level:
        way = "above" if other_level > level else "beside"
        return (f"{room} (level {level}) may not include {other} (level {other_level}): the arrow points "
                f"{way}, not down the room order")
    if rooms.is_private(target, other, private):
        return f"{target} is private to {other} (rooms.txt)"
    return None


def check_readme(rooms):
    readme = os.path.join(rooms.root, "README.md")
    if not os.path.isfile(readme):
        return []
    listed = []
    names = {room for room, _, _ in rooms.table}
    with open(readme, encoding="utf-8") as f:
        for line in f:
            match = re.match(r"^\|\s*`([^`]+?)/?`\s*\|", line)
            if match and match.group(1) in names and match.group(1) not in listed:
                listed.append(match.group(1))
    wanted = [room for room, _, _ in rooms.table]
    if listed != wanted:
        return [f"README.md: the layout table names the rooms {listed}, rooms.txt {wanted}: keep them the same, "
                f"in the same order"]
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    args = parser.parse_args()
    try:
        rooms = Rooms(args.root, read_rooms(os.path.join(args.root, "rooms.txt")))
    except (BadTable, OSError) as e:
        print(f"check_layering: {e}", file=sys.stderr)
        return 2
    findings = check_includes(rooms) + check_readme(rooms)
    for finding in findings:
        print(finding)
    if findings:
        print(f"check_layering: FAILED, {len(findings)} finding(s)", file=sys.stderr)
        return 1
    print(f"check_layering: every include of {len(rooms.table)} rooms points down the room order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
