#!/usr/bin/env python3
"""Records Hugging Face's BERT uncased tokenization as tests/golden/tokenizer_golden.jsonl.gz.

    pip install transformers tokenizers
    python3 tests/golden/make_tokenizer_golden.py

The reference is the pure-Python tokenizer of transformers (in transformers 5 it is called
BertTokenizerLegacy; older releases call it BertTokenizer) on datasets/vocab/bert-base-uncased-vocab.txt.gz.
tests/data/test_tokenizer.cpp replays every record through ember::data::WordPieceTokenizer and
requires identical ids.

Records, one JSON object per line (the first is {"meta": ...}):
  text / text_hex      the input: a string, or raw bytes in hex for inputs that are not valid
                       UTF-8 (Python gets bytes.decode("utf-8", "replace"), C++ gets the bytes)
  text_b / text_b_hex  the second text of a pair
  options              add_special_tokens, truncation, max_length, padding
  input_ids, token_type_ids, attention_mask
  tokens               tokenizer.tokenize(text), for the hand-written cases
  decoded, decoded_skip decode(ids) and decode(ids, skip_special_tokens=True)
  codepoints [a, b], sep, wrap
                       a sweep: every code point c in [a, b) except surrogates, written as
                       wrap[0] + c + wrap[1] and joined with sep (ids only, no special tokens)

The Unicode version of this Python must match data/unicode_tables.cpp, since the sweep checks
every code point; rerun data/unicode_tables_gen.py with this Python first if it differs.
"""
import gzip
import json
import os
import random
import re
import sys
import unicodedata

import transformers

try:  # transformers >= 5
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as PyBertTokenizer
except ImportError:  # transformers 4.x: BertTokenizer is the pure-Python one
    from transformers import BertTokenizer as PyBertTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB_GZ = os.path.join(ROOT, "datasets/vocab/bert-base-uncased-vocab.txt.gz")
SST2_DEV = os.path.join(ROOT, "datasets/sst2/dev.tsv.gz")
TABLES = os.path.join(ROOT, "data/unicode_tables.cpp")
OUT = os.path.join(ROOT, "tests/golden/tokenizer_golden.jsonl.gz")

DEFAULT = {"add_special_tokens": True, "truncation": True, "max_length": 512, "padding": False}


def load_tokenizer(tmp_dir="/tmp"):
    vocab_txt = os.path.join(tmp_dir, "ember_golden_vocab.txt")
    with gzip.open(VOCAB_GZ, "rb") as src, open(vocab_txt, "wb") as dst:
        dst.write(src.read())
    return PyBertTokenizer(vocab_txt, do_lower_case=True)


def check_unicode_version():
    with open(TABLES, encoding="utf-8") as f:
        m = re.search(r'kUnicodeVersion = "([^"]+)"', f.read())
    if m.group(1) != unicodedata.unidata_version:
        sys.exit("data/unicode_tables.cpp has Unicode %s but this Python has %s: regenerate the "
                 "tables with this Python first" % (m.group(1), unicodedata.unidata_version))


def as_text(value):
    """(python str, json fields) for a str or bytes input."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace"), value.hex()
    return value, None


def encode_record(tok, name, a, b=None, options=None, with_tokens=True):
    opts = dict(DEFAULT, **(options or {}))
    text_a, hex_a = as_text(a)
    rec = {"name": name}
    rec["text_hex" if hex_a is not None else "text"] = hex_a if hex_a is not None else text_a
    text_b = None
    if b is not None:
        text_b, hex_b = as_text(b)
        rec["text_b_hex" if hex_b is not None else "text_b"] = hex_b if hex_b is not None else text_b
    rec["options"] = opts
    enc = tok(text_a, text_b, add_special_tokens=opts["add_special_tokens"],
              truncation=opts["truncation"], max_length=opts["max_length"],
              padding="max_length" if opts["padding"] else False,
              return_token_type_ids=True, return_attention_mask=True)
    rec["input_ids"] = enc["input_ids"]
    rec["token_type_ids"] = enc["token_type_ids"]
    rec["attention_mask"] = enc["attention_mask"]
    if with_tokens and b is None:
        rec["tokens"] = tok.tokenize(text_a)
    rec["decoded"] = tok.decode(enc["input_ids"])
    rec["decoded_skip"] = tok.decode(enc["input_ids"], skip_special_tokens=True)
    return rec


HARD_CASES = [
    # accents and case
    ("accents", "Café naïve résumé Ångström façade über CRÈME BRÛLÉE"),
    ("accents_combining", "e\u0301 A\u030a o\u0308\u0304 n\u0303o\u0323\u0302 q\u0307\u0323"),
    ("vietnamese", "Tiếng Việt có dấu: Nguyễn Thị Minh Khai"),
    ("polish", "Zażółć gęślą jaźń ŁÓDŹ"),
    ("turkish", "İstanbul IŞIK ılık İİ i\u0307"),
    ("german", "Straße GROSSE ẞ Maße"),
    ("ligature_compat", "ﬁne ﬂow Ⅻ ½ ² ㎏ Å K"),
    ("greek_final_sigma", "ΟΔΟΣ ΣΑΣ. ὈΔΥΣΣΕΎΣ Σ ΑΣ' ΑΣ.Α ΑΣ\u0301 ΑΣ1 ΑΣ[MASK] Α\u0345Σ"),
    ("cyrillic", "Привет, МИР! Ёжик в тумане"),
    # CJK and other scripts
    ("cjk", "東京は日本の首都です。中文字符测试"),
    ("korean", "한국어 텍스트 각 각"),
    ("japanese_kana", "カタカナ ひらがな ｶﾀｶﾅ"),
    ("cjk_compat", "\uf900\uf901\ufa0e \U0002f800\U0002f801 \U00020000\U0002a6d6"),
    ("fullwidth", "ＡＢＣ１２３！？（テスト）"),
    ("mixed_scripts", "Hello мир 世界 مرحبا שלום नमस्ते สวัสดีครับ ქართული"),
    ("indic_marks", "क्षत्रिय हिन्दी தமிழ் ಕನ್ನಡ"),
    ("arabic_marks", "مُحَمَّد ٱلْعَرَبِيَّة"),
    # control and whitespace characters
    ("nul", "a\x00b\x00 c"),
    ("tabs_newlines", "tab\there\nnew\rline\r\nend"),
    ("c0_c1_controls", "\x01\x02\x1b[0m\x7f\x85\x9f x\x1cy\x1dz"),
    ("format_chars", "zero\u200bwidth\u200djoiner soft\u00adhyphen \ufeffbom \u2060wj \u202eRTL"),
    ("line_separators", "a\u2028b\u2029c \u0085d"),
    ("unicode_spaces", "a\u00a0b\u3000c\u2003d\u202fe\u1680f\u205fg\u000bh\u000ci"),
    ("replacement_char", "bad\ufffdchar \ufffd"),
    ("private_use_unassigned", "p\ue000q \U000f0000 r\u0378s \U000e0001t"),
    # invalid UTF-8 (C++ gets the bytes, Python the "replace" decoding)
    ("latin1_byte", b"caf\xe9 ok na\xefve"),
    ("invalid_lead_bytes", b"\xff\xfe bad \xc0\xaf overlong \xf5\x80"),
    ("truncated_sequences", b"trunc \xe4\xb8 x \xf0\x9f\x98 y \xe2\x82"),
    ("encoded_surrogate", b"\xed\xa0\x80 surrogate \xed\xbf\xbf"),
    ("above_max", b"\xf4\x90\x80\x80 too big"),
    ("continuation_bytes", b"ok\x80\x80ok \xbf"),
    ("mixed_valid_invalid", b"euro \xe2\x82\xac half \xe2\x82 \xe2\x82\xac\xe2"),
    ("invalid_in_word", b"ab\xffcd e\xcc"),
    # empty and blank
    ("empty", ""),
    ("spaces_only", "   "),
    ("nul_only", "\x00\x00"),
    ("whitespace_only", "\t\n\r \u3000"),
    ("marks_only", "\u0301\u0302 \u0303"),
    # long words
    ("word_100", "a" * 100),
    ("word_101", "a" * 101),
    ("word_99_plus_accent", "x" * 99 + "é"),
    ("accented_101", "é" * 101),
    ("accented_100", "é" * 100),
    ("long_real_word", "supercalifragilisticexpialidocious antidisestablishmentarianism"),
    ("long_repeat", "ab" * 60 + " " + "ab" * 50),
    ("long_unmatchable", "qzxv" * 10),
    # punctuation
    ("punct_runs", "!!!???... ,,, ;;; --- ***"),
    ("unicode_punct", "«quoted» — dash – ‘single’ “double” … ¿qué? ¡sí! 「かぎ」【括弧】"),
    ("ascii_symbols", "$100 & 50% off @home #tag ^caret `tick` ~tilde |pipe +plus =eq <lt> a-b_c/d\\e"),
    ("abbreviations", "e.g. U.S.A. don't it's we've I'm they're can't"),
    ("numbers", "3.14 1,000,000 2nd 10:30am 1/2 -5 +7"),
    ("wikitext", " = Valkyria Chronicles III = \n Senjō no Valkyria 3 @-@ 4 @,@ 000 @.@ 5 "),
    # emoji and symbols
    ("emoji", "I ❤️ NY 🤗🎉 👍🏽 👨‍👩‍👧 🇺🇸 ☃ ★"),
    ("math_symbols", "∑ ∫ √ ∞ ≠ ≤ ± × ÷ → ⇒ ∀x∃y"),
    ("currency", "€5 £3 ¥100 ₹20 ₿ ¢"),
    # special tokens in the text
    ("special_tokens", "the [MASK] sat on [CLS] hi [SEP] there [PAD] [UNK]"),
    ("special_lowercase", "[mask] [cls] [Mask]"),
    ("special_glued", "foo[MASK]bar[MASK][MASK]x"),
    ("special_broken", "[ MASK ] [MAS K] [[MASK]] [MASK"),
    ("special_after_invalid", b"\xe4[MASK]\xff[SEP]"),
]

PAIRS = [
    ("pair_short", "How old are you?", "I am six years old.", {}),
    ("pair_trunc_a_longer", "one two three four five six seven eight nine ten", "alpha beta", {"max_length": 8}),
    ("pair_trunc_b_longer", "alpha beta", "one two three four five six seven eight nine ten", {"max_length": 8}),
    ("pair_trunc_equal", "one two three four five", "six seven eight nine ten", {"max_length": 9}),
    ("pair_trunc_equal_odd", "one two three four five", "six seven eight nine ten", {"max_length": 8}),
    ("pair_trunc_both_to_zero", "one two three", "four five", {"max_length": 3}),
    ("pair_trunc_one_left", "one two three", "four five", {"max_length": 4}),
    ("pair_exact_fit", "one two", "three", {"max_length": 6}),
    ("pair_padded", "short", "pair", {"max_length": 12, "padding": True}),
    ("pair_trunc_padded", "a b c d e f g", "h i j", {"max_length": 7, "padding": True}),
    ("pair_empty_a", "", "only the second", {}),
    ("pair_empty_both", "", "", {"max_length": 5, "padding": True}),
    ("pair_no_special", "a b c", "d e", {"add_special_tokens": False}),
    ("pair_no_special_trunc", "a b c d", "e f", {"add_special_tokens": False, "max_length": 3}),
    ("pair_wordpieces", "unaffable tokenization", "re-tokenizing the uncharacteristically long words",
     {"max_length": 10}),
    ("pair_unicode", "Ünïcödé ΣΟΦΟΣ", "東京 🤗", {"max_length": 9}),
    ("pair_no_truncation", "one two three four", "five six", {"truncation": False, "max_length": 4}),
]

SINGLE_OPTIONS = [
    ("single_truncated", "one two three four five six seven", {"max_length": 5}),
    ("single_trunc_to_specials", "one two three", {"max_length": 2}),
    ("single_padded", "pad me", {"max_length": 10, "padding": True}),
    ("single_trunc_and_pad", "a b c d e f", {"max_length": 6, "padding": True}),
    ("single_no_special", "no special tokens here", {"add_special_tokens": False}),
    ("single_no_special_trunc", "a b c d e", {"add_special_tokens": False, "max_length": 2}),
    ("single_no_truncation_pad", "a b c", {"truncation": False, "max_length": 8, "padding": True}),
    ("single_wordpiece_trunc", "unaffable uncharacteristically", {"max_length": 6}),
]

# Characters for random strings: the interesting parts of each class side by side.
FUZZ_ALPHABET = (
    "aAeEiIsSzZ019 " "ΣΑσςΟΔ" "\u0301\u0308\u0327\u0345\u034f\u05b0\u0e31\u093f\u094d\u0f71\u0f72"
    "\U0001d165\U0001d16d\u302e\u0903" ".':·\u2019\u00ad^`" "!?,;-()[]{}\"«»" "\u00c0\u00e9\u00df\u0130\u0131\u1e9e"
    "가각각\u3131" "東京中\uf900" "\t\n\r\u00a0\u3000\u2028\x00\x07\u200b\ufeff\ufffd" "🤗👍\U0001f3fd\u200d"
    "ﬁ½Ⅻ" "\U00010400\U00010428"
)


def fuzz_cases(rng, count):
    out = []
    for i in range(count):
        n = rng.randint(1, 40)
        out.append(("fuzz_%03d" % i, "".join(rng.choice(FUZZ_ALPHABET) for _ in range(n))))
    return out


def sweep_records(tok, step=4096):
    recs = []
    for start in range(0, 0x110000, step):
        end = start + step
        cps = [c for c in range(start, end) if not 0xD800 <= c <= 0xDFFF]
        for sep, wrap in ((" ", ("", "")), (" ", ("a", "b"))):
            text = sep.join(wrap[0] + chr(c) + wrap[1] for c in cps)
            ids = tok(text, add_special_tokens=False, truncation=False)["input_ids"]
            recs.append({"name": "sweep U+%04X..U+%04X wrap=%s" % (start, end - 1, "".join(wrap) or "none"),
                         "codepoints": [start, end], "sep": sep, "wrap": list(wrap), "input_ids": ids})
    return recs


def read_sst2_dev():
    sentences = []
    with gzip.open(SST2_DEV, "rt", encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    for line in lines[1:]:
        if line.strip():
            sentences.append(line.rstrip("\r").split("\t")[0].rstrip(" "))
    return sentences


def main():
    check_unicode_version()
    tok = load_tokenizer()
    rng = random.Random(1234)
    records = [{"meta": {"transformers": transformers.__version__, "unicode": unicodedata.unidata_version,
                         "tokenizer": PyBertTokenizer.__name__, "vocab": "datasets/vocab/bert-base-uncased-vocab.txt.gz"}}]
    for i, s in enumerate(read_sst2_dev()):
        records.append(encode_record(tok, "sst2_dev_%03d" % i, s, options={"max_length": 128}, with_tokens=False))
    for name, text in HARD_CASES:
        records.append(encode_record(tok, name, text))
    for name, text, opts in SINGLE_OPTIONS:
        records.append(encode_record(tok, name, text, options=opts))
    for name, a, b, opts in PAIRS:
        records.append(encode_record(tok, name, a, b, options=opts))
    for name, text in fuzz_cases(rng, 400):
        records.append(encode_record(tok, name, text))
    records.extend(sweep_records(tok))

    with open(OUT, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        for r in records:
            f.write((json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
    print("wrote %s: %d records, %d bytes" % (OUT, len(records), os.path.getsize(OUT)))


if __name__ == "__main__":
    main()
