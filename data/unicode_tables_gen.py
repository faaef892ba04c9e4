#!/usr/bin/env python3
"""Writes data/unicode_tables.cpp: the Unicode properties the BERT tokenizer needs.

    python3 data/unicode_tables_gen.py > data/unicode_tables.cpp

Uses only the standard library (unicodedata), so the tables follow the Unicode version of the
Python that runs it; the golden tokenizer test must be made with the same version (it checks
every code point). Everything is stored as sorted ranges, which keeps the file small.

Properties, all over the whole code space U+0000..U+10FFFF:
  char class  what BERT's basic tokenizer does with a character: drop it (NUL, U+FFFD, category
              C* except tab/LF/CR), turn it into a space (space, tab, LF, CR, Zs), split on it
              like str.split() does (other str.isspace() characters that survive cleaning,
              i.e. U+2028/U+2029), split it off as punctuation (ASCII punctuation ranges or a
              P* category), or drop it when stripping accents (Mn).
  lowercase   str.lower() of the character alone (U+03A3 is left to the final-sigma rule).
  cased / case-ignorable
              the two properties str.lower() consults for the final-sigma rule, read off
              Python's own behaviour so that they match it exactly.
  ccc         canonical combining class (for canonical reordering in NFD).
  nfd         full canonical decomposition (Hangul syllables are decomposed in code).
"""
import bisect
import sys
import unicodedata

MAX_CP = 0x10FFFF
SIGMA = 0x03A3

# Keep in step with enum class CharClass in data/unicode.h.
OTHER, DROP, SPACE, SPLIT, PUNCT, MARK = range(6)
CLASS_NAMES = ["Other", "Drop", "Space", "Split", "Punct", "Mark"]


def is_ascii_punct(cp):
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126


def char_class(cp):
    c = chr(cp)
    cat = unicodedata.category(c)
    if c in " \t\n\r" or cat == "Zs":
        return SPACE
    if cp == 0 or cp == 0xFFFD or cat.startswith("C"):
        return DROP
    if c.isspace():
        return SPLIT
    if is_ascii_punct(cp) or cat.startswith("P"):
        return PUNCT
    if cat == "Mn":
        return MARK
    return OTHER


def final_sigma_props(cp):
    """(case_ignorable, cased) as str.lower() sees them (cased only matters if not ignorable)."""
    c = chr(cp)
    before = ("A" + c + "\u03a3").lower()[-1] == "\u03c2"  # ignorable or cased
    after = ("A\u03a3" + c).lower()[1] == "\u03c2"  # ignorable or not cased
    ignorable = before and after
    cased = (not ignorable) and before
    return ignorable, cased


def runs(values):
    """[(first, last, value)] for maximal runs of equal values, dropping value None/0/False."""
    out = []
    start, cur = 0, values[0]
    for cp in range(1, len(values) + 1):
        v = values[cp] if cp < len(values) else object()
        if v != cur:
            if cur:
                out.append((start, cp - 1, cur))
            start, cur = cp, v
    return out


def lower_ranges(single):
    """Groups {cp: lower_cp} into (first, last, delta, stride) runs with stride 1 or 2."""
    cps = sorted(single)
    out = []
    i = 0
    while i < len(cps):
        first = cps[i]
        delta = single[first] - first
        best_last, best_stride, best_j = first, 1, i + 1
        for stride in (1, 2):
            j, last = i + 1, first
            while j < len(cps) and cps[j] == last + stride and single[cps[j]] - cps[j] == delta:
                last = cps[j]
                j += 1
            if j > best_j:
                best_last, best_stride, best_j = last, stride, j
        out.append((first, best_last, delta, best_stride))
        i = best_j
    return out


def self_check(class_runs, classes, lowers, single_lower):
    """Replays the C++ lookups (last entry starting at or before cp) over every code point."""
    starts = [r[0] for r in class_runs]
    lower_starts = [r[0] for r in lowers]
    for cp in range(MAX_CP + 1):
        assert class_runs[bisect.bisect_right(starts, cp) - 1][1] == classes[cp], hex(cp)
        i = bisect.bisect_right(lower_starts, cp) - 1
        got = None
        if i >= 0:
            first, last, delta, stride = lowers[i]
            if cp <= last and (cp - first) % stride == 0:
                got = cp + delta
        assert got == single_lower.get(cp), hex(cp)


def main():
    classes = [char_class(cp) for cp in range(MAX_CP + 1)]

    single_lower, multi_lower = {}, {}
    ignorable = [False] * (MAX_CP + 1)
    cased = [False] * (MAX_CP + 1)
    ccc = [0] * (MAX_CP + 1)
    nfd = {}
    for cp in range(MAX_CP + 1):
        c = chr(cp)
        ccc[cp] = unicodedata.combining(c)
        ignorable[cp], cased[cp] = final_sigma_props(cp)
        if cp != SIGMA:
            low = c.lower()
            if low != c:
                if len(low) == 1:
                    single_lower[cp] = ord(low)
                else:
                    multi_lower[cp] = [ord(x) for x in low]
        if not (0xAC00 <= cp <= 0xD7A3):
            d = unicodedata.normalize("NFD", c)
            if d != c:
                nfd[cp] = [ord(x) for x in d]

    # Facts the C++ pipeline relies on; fail loudly if a future Unicode breaks them.
    # Characters that reach lowercasing/NFD (not dropped or made spaces) never yield whitespace.
    for cp, seq in list(nfd.items()) + list(multi_lower.items()):
        if classes[cp] not in (DROP, SPACE):
            for x in seq:
                assert not chr(x).isspace(), hex(cp)
    for cp in range(MAX_CP + 1):
        if classes[cp] == SPLIT:
            assert not ignorable[cp] and not cased[cp], hex(cp)
    assert not ignorable[ord(" ")] and not cased[ord(" ")]

    class_runs = []
    prev = None
    for cp, cl in enumerate(classes):
        if cl != prev:
            class_runs.append((cp, cl))
            prev = cl
    lowers = lower_ranges(single_lower)
    ignorable_runs = runs(ignorable)
    cased_runs = runs(cased)
    ccc_runs = runs(ccc)
    pool, decomp = [], []
    for cp in sorted(nfd):
        decomp.append((cp, len(pool), len(nfd[cp])))
        pool.extend(nfd[cp])

    self_check(class_runs, classes, lowers, single_lower)

    w = sys.stdout.write
    w("// Generated by data/unicode_tables_gen.py from Python %s unicodedata (Unicode %s).\n"
      % (sys.version.split()[0], unicodedata.unidata_version))
    w("// Do not edit by hand: rerun the script. See data/unicode.h for what each table means.\n")
    w('#include "data/unicode_tables.h"\n\nnamespace ember::data::unicode::tables {\n\n')
    w('const char* const kUnicodeVersion = "%s";\n\n' % unicodedata.unidata_version)

    def emit(decl, items, per_line):
        w("%s = {\n" % decl)
        for k in range(0, len(items), per_line):
            w("    " + " ".join(items[k:k + per_line]) + "\n")
        w("};\n")
        w("const size_t %s = %d;\n\n" % (decl.split()[-1].replace("[]", "") + "Size", len(items)))

    emit("const ClassRun kClassRuns[]",
         ["{0x%X, %d}," % (cp, cl) for cp, cl in class_runs], 6)
    emit("const LowerRange kLowerRanges[]",
         ["{0x%X, 0x%X, %d, %d}," % r for r in lowers], 4)
    multi = []
    for cp in sorted(multi_lower):
        seq = multi_lower[cp] + [0] * (3 - len(multi_lower[cp]))
        multi.append("{0x%X, {0x%X, 0x%X, 0x%X}}," % (cp, *seq))
    emit("const LowerMulti kLowerMulti[]", multi, 2)
    emit("const Range kCaseIgnorable[]", ["{0x%X, 0x%X}," % (a, b) for a, b, _ in ignorable_runs], 6)
    emit("const Range kCased[]", ["{0x%X, 0x%X}," % (a, b) for a, b, _ in cased_runs], 6)
    emit("const CombiningRun kCombiningClass[]", ["{0x%X, 0x%X, %d}," % r for r in ccc_runs], 5)
    emit("const Decomposition kDecompositions[]", ["{0x%X, %d, %d}," % d for d in decomp], 5)
    emit("const char32_t kDecompositionPool[]", ["0x%X," % x for x in pool], 10)
    w("}  // namespace ember::data::unicode::tables\n")

    sys.stderr.write(
        "class runs %d, lower ranges %d (+%d multi), case-ignorable %d, cased %d, ccc %d, "
        "decompositions %d (pool %d)\n" % (len(class_runs), len(lowers), len(multi_lower),
                                           len(ignorable_runs), len(cased_runs), len(ccc_runs),
                                           len(decomp), len(pool)))


if __name__ == "__main__":
    main()
