// Softmax of one float row with an additive mask, the pieces shared by the fused softmax and
// the fused attention kernels (kernels/cpu/fused_softmax.cpp, fused_attention.cpp), so both
// compute, and recompute in their backward passes, the same probabilities bit for bit:
//   v = x * scale + mask,  m = max v,  e = exp(v - m),  y = e * (1 / sum e).
// Row sums accumulate in float lanes flushed into double every 512 elements.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/tensor.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/vec_half.h"

namespace ember::cpu {

using vec8::convert_row;
using vec8::exp8;
using vec8::f8;
using vec8::hsum;
using vec8::i8;
using vec8::kLanes;
using vec8::load8;
using vec8::load_tail;
using vec8::store8;
using vec8::store_tail;

// fn(type_tag<T>) for the float-lane dtypes f32, bf16, f16.
template <typename Fn>
inline void with_lane_type(DType dt, const char* op, const Fn& fn) {
  switch (dt) {
    case DType::f32: return fn(type_tag<float>{});
    case DType::bf16: return fn(type_tag<BFloat16>{});
    case DType::f16: return fn(type_tag<Half>{});
    default: EMBER_FAIL(op, ": unexpected dtype ", dtype_name(dt));
  }
}

constexpr int64_t kSoftmaxFlush = 64 * vec8::kLanes;

// Row r of the mask (x's shape through broadcast strides) as values of type A, either in place
// (contiguous row of A) or gathered into buf.
template <typename A>
class MaskRows {
 public:
  MaskRows(const Tensor& mask, const Shape& shape) : defined_(mask.defined()) {
    if (!defined_) return;
    base_ = static_cast<const char*>(mask.raw_data());
    dtype_ = mask.dtype();
    elem_ = int64_t(mask.element_size());
    const int64_t nd = int64_t(shape.size());
    last_stride_ = mask.strides()[size_t(nd - 1)];
    sizes_.assign(shape.begin(), shape.end() - 1);
    strides_.assign(mask.strides().begin(), mask.strides().end() - 1);
  }
  bool defined() const { return defined_; }

  const A* row(int64_t r, int64_t len, A* buf) const {
    int64_t off = 0;
    for (int64_t d = int64_t(sizes_.size()) - 1; d >= 0; --d) {
      off += (r % sizes_[size_t(d)]) * strides_[size_t(d)];
      r /= sizes_[size_t(d)];
    }
    const char* p = base_ + off * elem_;
    if (dtype_ == dtype_of<A>::value && last_stride_ == 1) return reinterpret_cast<const A*>(p);
    if constexpr (std::is_same_v<A, double>) {
      visit_floating(dtype_, "softmax mask", [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* q = reinterpret_cast<const T*>(p);
        for (int64_t j = 0; j < len; ++j) buf[j] = double(acc_t<T>(q[j * last_stride_]));
      });
    } else {
      with_lane_type(dtype_, "softmax mask", [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* q = reinterpret_cast<const T*>(p);
        if (last_stride_ == 1) {
          convert_row(buf, q, len);
        } else {
          for (int64_t j = 0; j < len; ++j) buf[j] = float(q[j * last_stride_]);
        }
      });
    }
    return buf;
  }

 private:
  bool defined_ = false;
  const char* base_ = nullptr;
  DType dtype_ = DType::f32;
  int64_t elem_ = 4, last_stride_ = 1;
  std::vector<int64_t> sizes_, strides_;
};

// v = x * scale + mask (mask may be null).
template <typename T>
void scores_row(float* v, const T* x, const float* mask, float scale, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const f8 s = load8(x + i) * scale;
    store8(v + i, mask ? s + load8(mask + i) : s);
  }
  for (; i < n; ++i) v[i] = float(x[i]) * scale + (mask ? mask[i] : 0.0f);
}

// Max of v, or NaN when v holds one.
inline float row_max(const float* v, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  f8 m = f8{} + ninf;
  i8 nan = i8{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const f8 x = load8(v + i);
    nan |= x != x;
    m = x > m ? x : m;
  }
  if (i < n) {
    const f8 x = load_tail(v + i, n - i, ninf);
    nan |= x != x;
    m = x > m ? x : m;
  }
  float best = ninf;
  bool any_nan = false;
  for (int k = 0; k < kLanes; ++k) {
    best = m[k] > best ? m[k] : best;
    any_nan |= nan[k] != 0;
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : best;
}

// e = exp(v - m) in place; returns the sum of e (float lanes flushed into double).
inline double exp_row(float* v, int64_t n, float m) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kSoftmaxFlush) {
    const int64_t end = std::min(n, b + kSoftmaxFlush);
    f8 acc = f8{};
    int64_t i = b;
    for (; i + kLanes <= end; i += kLanes) {
      const f8 e = exp8(load8(v + i) - m);
      store8(v + i, e);
      acc += e;
    }
    if (i < end) {
      const f8 e = exp8(load_tail(v + i, end - i, -std::numeric_limits<float>::infinity()) - m);
      store_tail(v + i, e, end - i);
      acc += e;
    }
    total += hsum(acc);
  }
  return total;
}

inline void scale_row(float* v, int64_t n, float s) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store8(v + i, load8(v + i) * s);
  for (; i < n; ++i) v[i] *= s;
}

// sum of a[i] * b[i]
inline double dot_row(const float* a, const float* b, int64_t n) {
  double total = 0;
  for (int64_t s = 0; s < n; s += kSoftmaxFlush) {
    const int64_t end = std::min(n, s + kSoftmaxFlush);
    f8 acc = f8{};
    int64_t i = s;
    for (; i + kLanes <= end; i += kLanes) acc += load8(a + i) * load8(b + i);
    if (i < end) acc += load_tail(a + i, end - i, 0.0f) * load_tail(b + i, end - i, 0.0f);
    total += hsum(acc);
  }
  return total;
}

}  // namespace ember::cpu
