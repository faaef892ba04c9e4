// UTF-8 decoding/encoding and the few Unicode algorithms text pipelines need: character
// classes for BERT's basic tokenizer, Python's str.lower(), and canonical decomposition (NFD).
// The data comes from data/unicode_tables.cpp (generated from Python's unicodedata), so these
// functions agree with Python of the same Unicode version character for character.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace ember::data::unicode {

// What to do with bytes that are not valid UTF-8 (per the Unicode "maximal subpart" rule:
// a broken sequence ends before the first byte that cannot continue it, so no valid
// character after it is ever swallowed).
enum class InvalidUtf8 {
  Replace,  // each maximal invalid subpart becomes one U+FFFD, like Python's errors="replace"
  Latin1,   // each byte of an invalid subpart becomes the Latin-1 code point of that byte
};

// Decodes UTF-8; never fails. Surrogates (ED A0..BF xx) and overlong forms count as invalid.
// The number of bytes in invalid subparts is added to *invalid_bytes when given.
std::u32string decode_utf8(std::string_view bytes, InvalidUtf8 mode = InvalidUtf8::Replace,
                           size_t* invalid_bytes = nullptr);
// True when `bytes` is entirely valid UTF-8.
bool is_valid_utf8(std::string_view bytes);
// Appends the UTF-8 encoding of `cp` (which must be a scalar value, not a surrogate).
void append_utf8(char32_t cp, std::string& out);
std::string encode_utf8(std::u32string_view text);

// How BERT's basic tokenizer treats a character (keep in step with unicode_tables_gen.py).
enum class CharClass : uint8_t {
  Other = 0,
  Drop = 1,   // NUL, U+FFFD, control/format/unassigned/private-use (C*) except tab, LF, CR
  Space = 2,  // space, tab, LF, CR and Zs: cleaned to a plain space
  Split = 3,  // other whitespace that Python's str.split() splits on (U+2028, U+2029)
  Punct = 4,  // ASCII punctuation ranges and P* categories
  Mark = 5,   // nonspacing marks (Mn), removed when stripping accents
};
CharClass char_class(char32_t cp);

// CJK ideograph blocks that BERT surrounds with spaces (its own definition, kept verbatim).
bool is_cjk_ideograph(char32_t cp);

// Python's str.lower(): full lowercase mapping (U+0130 becomes two code points) and the
// final-sigma rule for U+03A3, whose context is the whole of `text`.
std::u32string to_lower(std::u32string_view text);

// Canonical decomposition (NFD): full decomposition, Hangul syllables included, then
// canonical reordering of combining marks.
std::u32string nfd(std::u32string_view text);

// Canonical combining class (0 for starters).
uint8_t combining_class(char32_t cp);

// Unicode version of the tables (e.g. "14.0.0").
const char* unicode_version();

}  // namespace ember::data::unicode
