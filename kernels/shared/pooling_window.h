// The windows of 2-D pooling, shared by the CPU and CUDA kernels so both clip, count and invert
// them identically (constexpr, so device code may call them). A dim is described by its part
// of Pool2dGeometry; `o` is an output position, `i` an input position.
#pragma once
#include <cstdint>

#include "core/native/pooling.h"

namespace ember::kernels {

struct PoolDim {
  int64_t in, out, kernel, stride, pad, dilation;
};

constexpr PoolDim pool_dim_h(const native::Pool2dGeometry& g) {
  return {g.in_h, g.out_h, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h};
}
constexpr PoolDim pool_dim_w(const native::Pool2dGeometry& g) {
  return {g.in_w, g.out_w, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w};
}

// The input range [begin, end) an average window covers, and the count it divides by.
struct AvgWindow {
  int64_t begin, end, count;
};

constexpr AvgWindow avg_window(const PoolDim& d, int64_t o, bool adaptive, bool count_include_pad) {
  if (adaptive) {
    const int64_t b = o * d.in / d.out, e = ((o + 1) * d.in + d.out - 1) / d.out;
    return {b, e, e - b};
  }
  int64_t b = o * d.stride - d.pad;
  int64_t e = b + d.kernel < d.in + d.pad ? b + d.kernel : d.in + d.pad;  // ceil mode may cut the last window
  const int64_t padded = e - b;
  b = b < 0 ? 0 : b;
  e = e > d.in ? d.in : e;
  return {b, e, count_include_pad ? padded : e - b};
}

// The outputs [begin, end) whose average windows may cover input i (every one of them does).
struct OutRange {
  int64_t begin, end;
};

constexpr OutRange avg_outputs_of(const PoolDim& d, int64_t i, bool adaptive) {
  if (adaptive) return {i * d.out / d.in, ((i + 1) * d.out + d.in - 1) / d.in};
  // o * stride - pad <= i < o * stride - pad + kernel
  const int64_t lo_num = i + d.pad - d.kernel + 1;
  int64_t b = lo_num <= 0 ? 0 : (lo_num + d.stride - 1) / d.stride;
  int64_t e = (i + d.pad) / d.stride + 1;
  e = e > d.out ? d.out : e;
  return {b, e < b ? b : e};
}

// The outputs whose max windows reach input i at some kernel position (a superset when the
// dilation skips i; the backward compares indices, so that is enough).
constexpr OutRange max_outputs_of(const PoolDim& d, int64_t i) {
  const int64_t lo_num = i + d.pad - (d.kernel - 1) * d.dilation;
  int64_t b = lo_num <= 0 ? 0 : (lo_num + d.stride - 1) / d.stride;
  int64_t e = (i + d.pad) / d.stride + 1;
  e = e > d.out ? d.out : e;
  return {b, e < b ? b : e};
}

// The first in-range kernel position of max window o (the index an all -inf window reports).
constexpr int64_t max_window_first(const PoolDim& d, int64_t o) {
  int64_t b = o * d.stride - d.pad;
  while (b < 0) b += d.dilation;
  return b;
}

}  // namespace ember::kernels
