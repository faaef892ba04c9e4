// A convolution's padding argument, as PyTorch takes it: numbers (one for every spatial dim, or
// one per dim) or the strings "same" / "valid". One type rather than two overloads, so a braced
// list such as {1, 0} is never read as a std::string of two chars.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/shape.h"

namespace ember {

class ConvPadding {
 public:
  // Implicit, so padding = 1, {1, 2}, "same" and a Shape all read as in PyTorch.
  ConvPadding(int value) : values_{value} {}  // NOLINT(google-explicit-constructor)
  ConvPadding(int64_t value) : values_{value} {}  // NOLINT(google-explicit-constructor)
  ConvPadding(std::initializer_list<int64_t> values) : values_(values) {}  // NOLINT(google-explicit-constructor)
  ConvPadding(Shape values) : values_(std::move(values)) {}  // NOLINT(google-explicit-constructor)
  ConvPadding(const char* mode) : mode_(mode) {}  // NOLINT(google-explicit-constructor)
  ConvPadding(std::string mode) : mode_(std::move(mode)) {}  // NOLINT(google-explicit-constructor)

  bool named() const { return !mode_.empty(); }
  const std::string& mode() const { return mode_; }  // "same", "valid" (or a wrong name), when named()
  const Shape& values() const { return values_; }    // when !named()

 private:
  Shape values_;
  std::string mode_;
};

}  // namespace ember
