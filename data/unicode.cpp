#include "data/unicode.h"

#include <algorithm>

#include "data/unicode_tables.h"

namespace ember::data::unicode {

namespace t = tables;

namespace {

// Hangul syllable composition constants (Unicode chapter 3.12).
constexpr char32_t kHangulFirst = 0xAC00, kHangulLast = 0xD7A3;
constexpr char32_t kJamoL = 0x1100, kJamoV = 0x1161, kJamoT = 0x11A7;
constexpr char32_t kJamoVCount = 21, kJamoTCount = 28;
constexpr char32_t kCapitalSigma = 0x03A3, kSmallSigma = 0x03C3, kFinalSigma = 0x03C2;

// Index of the last entry whose `first` is <= cp, or -1.
template <typename T>
std::ptrdiff_t last_at_or_before(const T* table, size_t size, char32_t cp) {
  const T* it = std::upper_bound(table, table + size, cp,
                                 [](char32_t v, const T& e) { return v < e.first; });
  return (it - table) - 1;
}

bool in_ranges(const t::Range* table, size_t size, char32_t cp) {
  std::ptrdiff_t i = last_at_or_before(table, size, cp);
  return i >= 0 && cp <= table[i].last;
}

bool is_case_ignorable(char32_t cp) { return in_ranges(t::kCaseIgnorable, t::kCaseIgnorableSize, cp); }
bool is_cased(char32_t cp) { return in_ranges(t::kCased, t::kCasedSize, cp); }

// str.lower()'s Final_Sigma context: a cased letter before (skipping case-ignorables) and
// no cased letter after (skipping case-ignorables).
bool is_final_sigma(std::u32string_view text, size_t i) {
  std::ptrdiff_t j = std::ptrdiff_t(i) - 1;
  while (j >= 0 && is_case_ignorable(text[size_t(j)])) --j;
  if (j < 0 || !is_cased(text[size_t(j)])) return false;
  size_t k = i + 1;
  while (k < text.size() && is_case_ignorable(text[k])) ++k;
  return k == text.size() || !is_cased(text[k]);
}

void append_lower(char32_t cp, std::u32string& out) {
  std::ptrdiff_t i = last_at_or_before(t::kLowerRanges, t::kLowerRangesSize, cp);
  if (i >= 0) {
    const t::LowerRange& r = t::kLowerRanges[i];
    if (cp <= r.last && (cp - r.first) % r.stride == 0) {
      out.push_back(char32_t(int64_t(cp) + r.delta));
      return;
    }
  }
  const t::LowerMulti* m = std::lower_bound(
      t::kLowerMulti, t::kLowerMulti + t::kLowerMultiSize, cp,
      [](const t::LowerMulti& e, char32_t v) { return e.code_point < v; });
  if (m != t::kLowerMulti + t::kLowerMultiSize && m->code_point == cp) {
    for (char32_t c : m->lower)
      if (c) out.push_back(c);
    return;
  }
  out.push_back(cp);
}

void append_decomposition(char32_t cp, std::u32string& out) {
  if (cp >= kHangulFirst && cp <= kHangulLast) {
    char32_t s = cp - kHangulFirst;
    out.push_back(kJamoL + s / (kJamoVCount * kJamoTCount));
    out.push_back(kJamoV + (s % (kJamoVCount * kJamoTCount)) / kJamoTCount);
    if (s % kJamoTCount) out.push_back(kJamoT + s % kJamoTCount);
    return;
  }
  const t::Decomposition* d = std::lower_bound(
      t::kDecompositions, t::kDecompositions + t::kDecompositionsSize, cp,
      [](const t::Decomposition& e, char32_t v) { return e.code_point < v; });
  if (d != t::kDecompositions + t::kDecompositionsSize && d->code_point == cp) {
    out.append(t::kDecompositionPool + d->offset, d->length);
    return;
  }
  out.push_back(cp);
}

// One UTF-8 sequence at bytes[i]: its code point, or invalid with the length of the
// maximal subpart (at least one byte).
struct Utf8Step {
  size_t length;
  char32_t cp;
  bool valid;
};

Utf8Step decode_one(std::string_view bytes, size_t i) {
  const auto b0 = static_cast<unsigned char>(bytes[i]);
  if (b0 < 0x80) return {1, b0, true};
  // Lead byte: how many continuation bytes follow and the allowed range of the first one
  // (this excludes overlong forms, surrogates and code points above U+10FFFF).
  int need = 0;
  char32_t cp = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, 0, false};
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= bytes.size()) return {j - i, 0, false};
    const auto b = static_cast<unsigned char>(bytes[j]);
    if (b < (k == 0 ? lo : 0x80) || b > (k == 0 ? hi : 0xBF)) return {j - i, 0, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {j - i, cp, true};
}

}  // namespace

std::u32string decode_utf8(std::string_view bytes, InvalidUtf8 mode, size_t* invalid_bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Step s = decode_one(bytes, i);
    if (s.valid) {
      out.push_back(s.cp);
    } else {
      if (invalid_bytes) *invalid_bytes += s.length;
      if (mode == InvalidUtf8::Replace)
        out.push_back(0xFFFD);
      else
        for (size_t k = i; k < i + s.length; ++k) out.push_back(static_cast<unsigned char>(bytes[k]));
    }
    i += s.length;
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {  // fast path: the corpora are mostly ASCII
      ++i;
      continue;
    }
    Utf8Step s = decode_one(bytes, i);
    if (!s.valid) return false;
    i += s.length;
  }
  return true;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(c, out);
  return out;
}

CharClass char_class(char32_t cp) {
  if (cp > 0x10FFFF) return CharClass::Drop;
  std::ptrdiff_t i = last_at_or_before(t::kClassRuns, t::kClassRunsSize, cp);
  return static_cast<CharClass>(t::kClassRuns[i].char_class);
}

bool is_cjk_ideograph(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

std::u32string to_lower(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == kCapitalSigma)
      out.push_back(is_final_sigma(text, i) ? kFinalSigma : kSmallSigma);
    else
      append_lower(text[i], out);
  }
  return out;
}

uint8_t combining_class(char32_t cp) {
  std::ptrdiff_t i = last_at_or_before(t::kCombiningClass, t::kCombiningClassSize, cp);
  return (i >= 0 && cp <= t::kCombiningClass[i].last) ? t::kCombiningClass[i].ccc : 0;
}

std::u32string nfd(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) append_decomposition(c, out);
  // Canonical ordering: a stable sort by combining class within each run of non-starters.
  for (size_t i = 1; i < out.size(); ++i) {
    uint8_t cc = combining_class(out[i]);
    if (cc == 0) continue;
    for (size_t k = i; k > 0 && combining_class(out[k - 1]) > cc; --k) std::swap(out[k - 1], out[k]);
  }
  return out;
}

const char* unicode_version() { return t::kUnicodeVersion; }

}  // namespace ember::data::unicode
