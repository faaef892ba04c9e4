// Walks N same-shaped (after broadcasting) strided operands element by element. Operand 0 is
// usually the output. Dimensions that are contiguous across all operands are merged, the
// innermost dimension becomes a row handed to `row_fn`, and rows are split across threads.
//
//   StridedLoop loop(out.shape(), {out, a, b});          // a, b already broadcast by strides
//   loop.run([&](char** p, const int64_t* s, int64_t n) { ... p[k] + i * s[k] ... });
#pragma once
#include <algorithm>
#include <array>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"

namespace ember {

class StridedLoop {
 public:
  static constexpr int kMaxOperands = 4;
  // Each operand is viewed with the given shape (broadcast: stride 0 where its size is 1 or missing).
  StridedLoop(const Shape& shape, const std::vector<Tensor>& operands);

  int num_operands() const { return n_; }
  int64_t numel() const { return numel_; }
  // True when every operand is contiguous over the whole range (one flat row).
  bool is_flat_contiguous() const;

  // row_fn(char** ptrs, const int64_t* byte_strides, int64_t count) for each row.
  template <typename RowFn>
  void run(const RowFn& row_fn, int64_t grain = 32768) const {
    if (numel_ == 0) return;
    const int64_t inner = shape_.empty() ? 1 : shape_.back();
    const int64_t rows = numel_ / inner;
    std::array<int64_t, kMaxOperands> inner_strides{};
    for (int k = 0; k < n_; ++k) inner_strides[k] = shape_.empty() ? 0 : strides_[k].back();
    if (rows == 1) {
      // one long row: split it across threads
      parallel_for(0, inner, grain, [&](int64_t b, int64_t e) {
        std::array<char*, kMaxOperands> p{};
        for (int k = 0; k < n_; ++k) p[k] = base_[k] + b * inner_strides[k];
        row_fn(p.data(), inner_strides.data(), e - b);
      });
      return;
    }
    const int64_t row_grain = std::max<int64_t>(1, grain / std::max<int64_t>(inner, 1));
    parallel_for(0, rows, row_grain, [&](int64_t rb, int64_t re) {
      std::array<char*, kMaxOperands> p{};
      for (int64_t r = rb; r < re; ++r) {
        row_pointers(r, p.data());
        row_fn(p.data(), inner_strides.data(), inner);
      }
    });
  }

 private:
  void row_pointers(int64_t row, char** out) const;
  int n_ = 0;
  int64_t numel_ = 0;
  Shape shape_;                                        // coalesced
  std::array<Shape, kMaxOperands> strides_;            // bytes, coalesced
  std::array<char*, kMaxOperands> base_{};
};

// Typed helpers for the common cases; `f` maps acc_t values. Fast path for contiguous data.
template <typename Out, typename In, typename F>
void unary_loop(const StridedLoop& loop, const F& f) {
  loop.run([&](char** p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const In* a = reinterpret_cast<const In*>(p[1]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
      for (int64_t i = 0; i < n; ++i) o[i] = Out(f(a[i]));
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = Out(f(*reinterpret_cast<const In*>(p[1] + i * s[1])));
    }
  });
}

template <typename Out, typename A, typename B, typename F>
void binary_loop(const StridedLoop& loop, const F& f) {
  loop.run([&](char** p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const A* a = reinterpret_cast<const A*>(p[1]);
    const B* b = reinterpret_cast<const B*>(p[2]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == sizeof(B)) {
      for (int64_t i = 0; i < n; ++i) o[i] = Out(f(a[i], b[i]));
    } else if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == 0) {
      const B bv = *b;
      for (int64_t i = 0; i < n; ++i) o[i] = Out(f(a[i], bv));
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = Out(f(*reinterpret_cast<const A*>(p[1] + i * s[1]),
                                                        *reinterpret_cast<const B*>(p[2] + i * s[2])));
    }
  });
}

}  // namespace ember
