#!/usr/bin/env python3
"""Doxygen input filter for Ember's headers: turns their plain `//` comments into doc comments.

Ember's headers document declarations with ordinary `//` comment blocks directly above them and
with trailing `// ...` comments on members. Doxygen only reads `///`, so this filter rewrites, in
the text Doxygen sees (never in the headers themselves):

  * the comment block at the top of a file into the file's description (`\\file`);
  * a comment block directly above a declaration at namespace or class scope into `///`;
  * a trailing comment after a member, enumerator or field into `///<`.

Comments inside function bodies, above preprocessor lines, closing braces, access specifiers
and namespaces, and one-line section headings (`// ---- who and where`) stay plain comments.
Characters that Doxygen would read as commands or HTML (\\ @ < > & # % $) are escaped outside
`code` spans; lines indented two spaces or more past `// ` are code examples, passed on
untouched inside \\code ... \\endcode. Every output line corresponds to the input line of the
same number, so Doxygen's warnings point at the real header lines.

Usage (Doxygen appends the file name): doxygen_filter.py HEADER
"""
import re
import sys

COMMENT_LINE = re.compile(r"^(\s*)//(?!/)(.*)$")
SECTION_RULER = re.compile(r"^\s*-{3,}")
NOT_DOCUMENTABLE = re.compile(r"^\s*(#|}|$|namespace\b|public:|private:|protected:|using namespace\b|static_assert\b)")

ESCAPED = {"\\": "\\\\", "@": "\\@", "<": "\\<", ">": "\\>", "&": "\\&", "#": "\\#", "%": "\\%", "$": "\\$"}


def escape_prose(text):
    """Escapes Doxygen command and HTML characters outside `code` spans."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unmatched backtick: no code spans on this line
        parts = [text]
    out = []
    for i, part in enumerate(parts):
        out.append(part if i % 2 else "".join(ESCAPED.get(c, c) for c in part))
    return "`".join(out)


def is_code_example(body):
    return body.startswith("  ") and body.strip() != ""


def convert_block(lines, indent, suffix=""):
    """Rewrites a block of `//` comment bodies as `///` lines; `suffix` ends the last line.

    A run of code-example lines is wrapped in \\code ... \\endcode, the two commands riding on
    the neighbouring lines so that no line is added."""
    code = [is_code_example(body) for body in lines]
    texts = [body if code[n] else (" " + escape_prose(body) if body else "") for n, body in enumerate(lines)]
    n = 0
    while n < len(lines):
        if not code[n]:
            n += 1
            continue
        end = n
        while end + 1 < len(lines) and code[end + 1]:
            end += 1
        if n == 0:
            texts[n] = " \\code " + texts[n]
        else:
            texts[n - 1] += " \\code"
        if end + 1 < len(lines):
            texts[end + 1] = " \\endcode" + texts[end + 1]
        else:
            texts[end] += " \\endcode"
        n = end + 1
    texts[-1] += suffix
    return [f"{indent}///{text}".rstrip() for text in texts]


def trailing_comment_start(line):
    """Index of a `//` comment that follows code on the line (outside string and character
    literals), or -1."""
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif line.startswith("//", i):
            return i if line[:i].strip() else -1
        i += 1
    return -1


def strip_strings_and_comments(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//", 1)[0]


class ScopeTracker:
    """Follows braces to tell namespace and class scope (where declarations live) from bodies."""

    def __init__(self):
        self.stack = []  # "ns", "class" or "body" per open brace
        self.pending = None  # what the next "{" opens, from the text seen since the last brace

    def at_declaration_scope(self):
        return all(kind != "body" for kind in self.stack)

    def feed(self, line):
        code = strip_strings_and_comments(line)
        if code.lstrip().startswith("#"):
            return
        for token in re.finditer(r"[{};]|\b(namespace|class|struct|union|enum)\b", code):
            t = token.group(0)
            if t == "namespace":
                self.pending = "ns"
            elif t in ("class", "struct", "union", "enum"):
                if self.pending is None:
                    self.pending = "class"
            elif t == "{":
                self.stack.append(self.pending or "body")
                self.pending = None
            elif t == "}":
                if self.stack:
                    self.stack.pop()
                self.pending = None
            elif t == ";":
                self.pending = None
        # `class X : public Y` or `template <class T>` without a brace yet: a template
        # parameter list's `class` must not make the next function body a class.
        if self.pending == "class" and re.search(r"template\s*<", code) and "{" not in code:
            self.pending = None


def filter_header(text):
    lines = text.split("\n")
    out = []
    scope = ScopeTracker()
    seen_code = False
    i = 0
    while i < len(lines):
        line = lines[i]
        m = COMMENT_LINE.match(line)
        if m:
            indent = m.group(1)
            block = []
            j = i
            while j < len(lines):
                mj = COMMENT_LINE.match(lines[j])
                if not mj or mj.group(1) != indent:
                    break
                body = mj.group(2)
                block.append(body[1:] if body.startswith(" ") else body)
                j += 1
            following = lines[j] if j < len(lines) else ""
            if not seen_code:
                # The file's own description: the comment blocks before the first code line.
                out.extend(convert_block(block, indent, suffix=" \\file"))
            elif scope.at_declaration_scope() and not NOT_DOCUMENTABLE.match(following):
                if SECTION_RULER.match(block[0]):
                    if len(block) == 1:  # a heading over a group of declarations
                        out.append(line)
                    else:  # a heading whose text goes on to describe the next declaration
                        out.extend(convert_block([SECTION_RULER.sub("", block[0]).lstrip()] + block[1:], indent))
                else:
                    out.extend(convert_block(block, indent))
            else:
                out.extend(lines[i:j])
            i = j
            continue
        if line.strip():
            seen_code = True
        start = trailing_comment_start(line)
        code = line[:start] if start >= 0 else ""
        if (start >= 0 and code.rstrip().endswith((";", ",")) and "{" not in code and scope.at_declaration_scope()
                and not NOT_DOCUMENTABLE.match(line) and not line[start:].startswith("///")):
            text = line[start + 2 :]
            text = text[1:] if text.startswith(" ") else text
            out.append(f"{code}///< {escape_prose(text)}".rstrip())
        else:
            out.append(line)
        scope.feed(line)
        i += 1
    return "\n".join(out)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: doxygen_filter.py HEADER\n")
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(filter_header(f.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
