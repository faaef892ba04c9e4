// Raw Unicode tables behind data/unicode.h, generated into data/unicode_tables.cpp by
// data/unicode_tables_gen.py. Every table is sorted by code point.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ember::data::unicode::tables {

// The character class (data/unicode.h CharClass) starting at `first`, up to the next run.
struct ClassRun {
  char32_t first;
  uint8_t char_class;
};
// Code points first, first + stride, ..., last lowercase to themselves plus delta.
struct LowerRange {
  char32_t first, last;
  int32_t delta;
  uint32_t stride;
};
// A code point whose lowercase is several code points (zero-padded).
struct LowerMulti {
  char32_t code_point;
  char32_t lower[3];
};
struct Range {
  char32_t first, last;
};
struct CombiningRun {
  char32_t first, last;
  uint8_t ccc;
};
// Full canonical decomposition of code_point: pool[offset .. offset + length).
struct Decomposition {
  char32_t code_point;
  uint16_t offset;
  uint8_t length;
};

extern const char* const kUnicodeVersion;
extern const ClassRun kClassRuns[];
extern const size_t kClassRunsSize;
extern const LowerRange kLowerRanges[];
extern const size_t kLowerRangesSize;
extern const LowerMulti kLowerMulti[];
extern const size_t kLowerMultiSize;
extern const Range kCaseIgnorable[];
extern const size_t kCaseIgnorableSize;
extern const Range kCased[];
extern const size_t kCasedSize;
extern const CombiningRun kCombiningClass[];
extern const size_t kCombiningClassSize;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionsSize;
extern const char32_t kDecompositionPool[];
extern const size_t kDecompositionPoolSize;

}  // namespace ember::data::unicode::tables
