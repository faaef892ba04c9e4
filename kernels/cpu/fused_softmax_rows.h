// Softmax of float rows with an additive mask, the pieces shared by the fused softmax and the
// fused attention kernels (kernels/cpu/fused_softmax.cpp, fused_attention.cpp), so both compute,
// and recompute in their backward passes, the same probabilities bit for bit:
//   v = x * scale + mask,  then the row softmax of kernels/cpu/softmax_rows.h (R rows at a time,
//   each row's bits the same alone or in a group).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/tensor.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/vec_half.h"

namespace ember::cpu {

using vec8::convert_row;
using vec8::f8;
using vec8::hsum;
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
    const size_t nd = shape.size();
    last_stride_ = mask.strides()[nd - 1];
    // the dims before the last, size-1 dims dropped and neighbours that step as one dim merged
    // (a padding mask's broadcast heads and query rows become one dim of stride 0)
    for (size_t d = 0; d + 1 < nd; ++d) {
      const int64_t size = shape[d], stride = mask.strides()[d];
      if (size == 1) continue;
      if (!sizes_.empty() && strides_.back() == stride * size) {
        sizes_.back() *= size;
        strides_.back() = stride;
      } else {
        sizes_.push_back(size);
        strides_.push_back(stride);
      }
    }
  }
  bool defined() const { return defined_; }
  // How many rows in turn share one mask row: a run of them starts at every multiple of this (the
  // size of the innermost dim where the mask broadcasts over it, else 1).
  int64_t rows_sharing_a_row() const { return !sizes_.empty() && strides_.back() == 0 ? sizes_.back() : 1; }

  const A* row(int64_t r, int64_t len, A* buf) const {
    // a division a dim but the outermost (r is below the row count); none for a stride-0 dim's index
    int64_t off = 0;
    for (size_t d = sizes_.size(); d-- > 1;) {
      if (strides_[d] != 0) off += (r % sizes_[d]) * strides_[d];
      r /= sizes_[d];
    }
    if (!sizes_.empty()) off += r * strides_[0];
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

// One score, x * scale + mask rounded once, or x * scale where there is no mask (mask null). The
// FMA is spelled out, so every compiler rounds it alike and the 16-lane kernels
// (kernels/cpu/softmax_avx512.cpp) can repeat it.
EMBER_LANES_INLINE f8 score8(f8 x, float scale, const float* mask) {
  return mask ? vec8::fma_lanes(x, f8{} + scale, load8(mask)) : x * scale;
}
inline float score(float x, float scale, const float* mask) { return mask ? std::fma(x, scale, *mask) : x * scale; }

// v = x * scale + mask (mask may be null).
template <typename T>
void scores_row(float* v, const T* x, const float* mask, float scale, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store8(v + i, score8(load8(x + i), scale, mask ? mask + i : nullptr));
  for (; i < n; ++i) v[i] = score(float(x[i]), scale, mask ? mask + i : nullptr);
}

// scores_row, also giving the max of v (NaNs ignored, as rows_max): the scores are still in
// registers, so this saves the max its own pass over the row.
template <typename T>
float scores_row_max(float* v, const T* x, const float* mask, float scale, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  f8 a = f8{} + ninf, b = a;  // two lanes of maxima, as in rows_max
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const f8 w = score8(load8(x + i), scale, mask ? mask + i : nullptr);
    const f8 w2 = score8(load8(x + i + kLanes), scale, mask ? mask + i + kLanes : nullptr);
    store8(v + i, w);
    store8(v + i + kLanes, w2);
    a = w > a ? w : a;
    b = w2 > b ? w2 : b;
  }
  for (; i + kLanes <= n; i += kLanes) {
    const f8 w = score8(load8(x + i), scale, mask ? mask + i : nullptr);
    store8(v + i, w);
    a = w > a ? w : a;
  }
  float m = vec8::hmax(a > b ? a : b);
  for (; i < n; ++i) {
    v[i] = score(float(x[i]), scale, mask ? mask + i : nullptr);
    m = v[i] > m ? v[i] : m;
  }
  return m;
}

// Probabilities of R rows: y[r] = softmax(x[r] * scale + mask[r]) (mask[r] may be null; y[r]
// holds the scores on the way, x[r] may be y[r]). Row r's statistics {max, 1 / sum} go to
// st[2r], st[2r + 1]. wide: on 16 lanes (R 1 or 2), the same bits.
template <int R, typename T>
void scaled_masked_softmax_rows(float* const* y, const T* const* x, const float* const* mask, float scale, int64_t n,
                                float* st, bool wide) {
  if (wide) return ScaledMaskedSoftmaxAvx512<T>::group(R, y, x, mask, scale, n, st);
  float m[R], inv[R];
  for (int r = 0; r < R; ++r) m[r] = scores_row_max(y[r], x[r], mask[r], scale, n);
  softmax_rows_from_max<R>(y, y, n, m, inv);
  for (int r = 0; r < R; ++r) st[2 * r] = m[r], st[2 * r + 1] = inv[r];
}

// The same y again, bit for bit, from the statistics scaled_masked_softmax_rows gave.
template <int R, typename T>
void scaled_masked_softmax_rows_again(float* const* y, const T* const* x, const float* const* mask, float scale,
                                      int64_t n, const float* st, bool wide) {
  if (wide) return ScaledMaskedSoftmaxAvx512<T>::group_again(R, y, x, mask, scale, n, st);
  for (int r = 0; r < R; ++r) scores_row(y[r], x[r], mask[r], scale, n);
  float m[R], inv[R];
  for (int r = 0; r < R; ++r) m[r] = st[2 * r], inv[r] = st[2 * r + 1];
  softmax_rows_from_stats<R>(y, y, n, m, inv);
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
