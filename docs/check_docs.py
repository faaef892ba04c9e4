#!/usr/bin/env python3
"""Keeps the documentation pages and the code they show in step.

For each page listed in PAGES:

  * A fenced code block right after `<!-- snippet: snippets/FILE.cpp#REGION -->` must equal that
    region of the snippet word for word (after removing their common indentation). A region is
    the lines between `// [REGION]` and `// [/REGION]`; marker lines of other regions inside it
    are left out. The snippets are compiled (docs/CMakeLists.txt), so this makes the pages' code
    compiled code.
  * A fenced block right after `<!-- excerpt: PATH -->` must appear, as consecutive lines, in
    that file of the source tree (the contributor guide quotes real code this way).
  * Every ```cpp block must carry one of those two markers.
  * In a table row that links a snippet (`](snippets/FILE.cpp)`), every `code` span of the
    second column (the Ember column) must occur in that snippet, spaces collapsed; spans that
    start with `ember ` are commands and are checked against the `ember` command instead.
  * With --cli: every `--flag` of an `ember launch` / `ember config` / `ember env` command
    shown on a page is one that `ember <command> --help` lists.
  * Every relative link of a page points at a file that exists.

Usage: check_docs.py --root SOURCE_DIR [--cli PATH_TO_EMBER]
Prints each problem with the page and line, and exits 1 when there is one.
"""
import argparse
import os
import re
import subprocess
import sys

PAGES = ["docs/quickstart.md", "docs/accelerate_mapping.md", "docs/contributing.md"]

MARKER = re.compile(r"^<!--\s*(snippet|excerpt):\s*(\S+?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
REGION_MARK = re.compile(r"^\s*//\s*\[(/?)([\w-]+)\]\s*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
SNIPPET_LINK = re.compile(r"\]\((snippets/[\w./-]+\.cpp)(?:#[\w-]*)?\)")
CLI_COMMAND = re.compile(r"\bember (launch|config|env|plot)\b([^`\n]*)")


def dedent(lines):
    lines = [line.rstrip() for line in lines]
    widths = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(widths) if widths else 0
    return [line[cut:] for line in lines]


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


def snippet_regions(path):
    """Region name -> its lines; raises ValueError on unbalanced markers."""
    lines = read_lines(path)
    regions, open_at = {}, {}
    for n, line in enumerate(lines):
        m = REGION_MARK.match(line)
        if not m:
            continue
        closing, name = m.group(1) == "/", m.group(2)
        if not closing:
            if name in open_at or name in regions:
                raise ValueError(f"{path}:{n + 1}: region '{name}' opened twice")
            open_at[name] = n
        else:
            if name not in open_at:
                raise ValueError(f"{path}:{n + 1}: region '{name}' closed but never opened")
            body = [l for l in lines[open_at.pop(name) + 1 : n] if not REGION_MARK.match(l)]
            regions[name] = dedent(body)
    if open_at:
        raise ValueError(f"{path}: region(s) never closed: {', '.join(sorted(open_at))}")
    return regions


def fenced_blocks(lines):
    """(marker or None, marker line, language, first line number, block lines) per fenced block."""
    blocks = []
    n = 0
    while n < len(lines):
        m = FENCE.match(lines[n])
        if not m:
            n += 1
            continue
        language = m.group(2)
        end = n + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        marker = None
        if n > 0:
            mm = MARKER.match(lines[n - 1].strip())
            if mm:
                marker = (mm.group(1), mm.group(2))
        blocks.append((marker, n, language, n + 2, lines[n + 1 : end]))
        n = end + 1
    return blocks


def contains_block(file_lines, block):
    block = dedent(block)
    size = len(block)
    for start in range(0, len(file_lines) - size + 1):
        if dedent(file_lines[start : start + size]) == block:
            return True
    return False


def collapse(text):
    return re.sub(r"\s+", " ", text).strip()


def table_cells(line):
    cells = re.split(r"(?<!\\)\|", line.strip())
    return [c.strip() for c in cells[1:-1]] if line.strip().startswith("|") else []


class Checker:
    def __init__(self, root, cli):
        self.root = root
        self.cli = cli
        self.problems = []
        self.cli_help = {}

    def problem(self, where, text):
        self.problems.append(f"{where}: {text}")

    def help_of(self, command):
        if command not in self.cli_help:
            result = subprocess.run([self.cli, command, "--help"], capture_output=True, text=True)
            self.cli_help[command] = result.stdout if result.returncode == 0 else None
        return self.cli_help[command]

    def check_cli(self, where, text):
        if not self.cli:
            return
        for m in CLI_COMMAND.finditer(text):
            command, rest = m.group(1), m.group(2)
            usage = self.help_of(command)
            if usage is None:
                self.problem(where, f"`ember {command} --help` failed")
                continue
            for flag in re.findall(r"(?<![\w-])(--[a-z_]+|-[a-z])\b", rest):
                if not re.search(r"(^|[\s,])" + re.escape(flag) + r"\b", usage):
                    self.problem(where, f"`ember {command}` has no option {flag}")

    def check_page(self, page):
        path = os.path.join(self.root, page)
        page_dir = os.path.dirname(path)
        lines = read_lines(path)
        for marker, fence_line, language, first, block in fenced_blocks(lines):
            where = f"{page}:{first - 1}"
            for offset, text in enumerate(block):
                self.check_cli(f"{page}:{first + offset}", text)
            if marker is None:
                if language in ("cpp", "c++"):
                    self.problem(where, "a C++ block without a <!-- snippet: ... --> or <!-- excerpt: ... --> marker")
                continue
            kind, target = marker
            if kind == "snippet":
                file_part, _, region = target.partition("#")
                source = os.path.join(page_dir, file_part)
                if not region:
                    self.problem(where, f"snippet marker '{target}' names no #region")
                    continue
                try:
                    regions = snippet_regions(source)
                except (OSError, ValueError) as e:
                    self.problem(where, str(e))
                    continue
                if region not in regions:
                    self.problem(where, f"{file_part} has no region '{region}'")
                elif dedent(block) != regions[region]:
                    self.problem(where, f"the block differs from {file_part}#{region}:\n"
                                 + "\n".join(f"    | {l}" for l in regions[region]))
            else:
                source = os.path.normpath(os.path.join(page_dir, target))
                try:
                    source_lines = read_lines(source)
                except OSError as e:
                    self.problem(where, str(e))
                    continue
                if not contains_block(source_lines, block):
                    self.problem(where, f"the block is not (any more) in {target}")
        in_fence = False
        for n, line in enumerate(lines, start=1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            where = f"{page}:{n}"
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                file_part = target.split("#", 1)[0]
                if not os.path.exists(os.path.join(page_dir, file_part)):
                    self.problem(where, f"link to a missing file: {target}")
            for span in CODE_SPAN.findall(line):
                self.check_cli(where, span)
            cells = table_cells(line)
            links = SNIPPET_LINK.findall(line)
            if len(cells) >= 2 and links:
                texts = []
                for link in links:
                    try:
                        with open(os.path.join(page_dir, link), encoding="utf-8") as f:
                            texts.append(collapse(f.read()))
                    except OSError as e:
                        self.problem(where, str(e))
                for span in CODE_SPAN.findall(cells[1]):
                    if span.startswith("ember "):
                        continue
                    if not any(collapse(span) in text for text in texts):
                        self.problem(where, f"`{span}` is not in {', '.join(links)}")

    def run(self):
        for page in PAGES:
            if not os.path.exists(os.path.join(self.root, page)):
                self.problem(page, "page missing")
                continue
            self.check_page(page)
        for problem in self.problems:
            print(problem)
        print(f"check_docs: {len(PAGES)} pages, {len(self.problems)} problem(s)")
        return 1 if self.problems else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="the source tree")
    parser.add_argument("--cli", help="the built `ember` command; checks the flags the pages show")
    args = parser.parse_args()
    return Checker(args.root, args.cli).run()


if __name__ == "__main__":
    sys.exit(main())
