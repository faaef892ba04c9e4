// CUDA scale + additive mask + softmax (+ dropout) over the last dim, forward and backward, on
// the stubs of core/native/fused.h. Semantics match kernels/cpu/fused_softmax.cpp:
//   v = x * scale + mask,  m = max v,  e = exp(v - m),  y = dropout(e * (1 / sum e)),
// in float for f32, bf16 and f16 data and in double for f64. stats [rows, 2] keeps m and
// 1 / sum e; the backward recomputes the probabilities from x, the mask and stats. A NaN
// anywhere in a row makes the row NaN; a row masked everywhere with -inf has m = -inf, so
// v - m is NaN and the row comes out NaN, as on the CPU.
//
// x, the mask, y and the gradient each come in their own dtype, so elements are read and
// written through a dtype code switched on per access (the same for every thread), one kernel
// per compute type. The mask is x's shape through broadcast strides (stride 0 where it was
// broadcast): its leading dims are merged on the host where they step evenly, and each row
// finds its mask row by dividing its index through the remaining sizes, once per row.
// v is formed with explicitly rounded operations (no FMA contraction), as the CPU forms it, and
// the backward forms it the same way, so both see the same scores.
//
// Rows go to one warp each up to 1024 elements and to one block each above; the max and the
// sums are warp-shuffle reductions (joined through shared memory across a block's warps). The
// dropout keeps element e = row * len + col exactly as the CPU does (kernels/cuda/philox.cuh).
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/native/copy.h"
#include "core/native/fused.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/dtype_io.cuh"
#include "kernels/cuda/philox.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using native::FusedDropout;

constexpr int kMaxMaskDims = 8;  // leading mask dims after merging; more fall back to a copy

// row teams (row_reduce.cuh), dtype-coded element access and rounded operations (dtype_io.cuh)
using namespace cuda;

// ---- the mask as x's [rows, len] through strides

struct MaskView {
  const void* data = nullptr;  // null: no mask
  Elem t = Elem::f32;
  int ndim = 0;                       // leading dims left after merging (0: one row for all)
  int64_t sizes[kMaxMaskDims] = {};   // outermost first
  int64_t strides[kMaxMaskDims] = {};
  int64_t col_stride = 0;             // along the softmax dim

  // Element offset of row r's first mask element.
  __device__ __forceinline__ int64_t row_offset(int64_t r) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      off += (r % sizes[d]) * strides[d];
      r /= sizes[d];
    }
    return off;
  }
};

// Fills `v` from a mask of x's shape; false when more than kMaxMaskDims leading dims remain.
bool build_mask_view(const Tensor& mask, const Shape& shape, MaskView& v) {
  const int64_t nd = int64_t(shape.size());
  v.ndim = 0;
  for (int64_t d = 0; d + 1 < nd; ++d) {
    const int64_t size = shape[size_t(d)], stride = mask.strides()[size_t(d)];
    if (size == 1) continue;
    // an outer dim stepping over the one inside it as one longer dim: merge the two
    if (v.ndim > 0 && v.strides[v.ndim - 1] == stride * size) {
      v.sizes[v.ndim - 1] *= size;
      v.strides[v.ndim - 1] = stride;
      continue;
    }
    if (v.ndim == kMaxMaskDims) return false;
    v.sizes[v.ndim] = size;
    v.strides[v.ndim] = stride;
    ++v.ndim;
  }
  v.col_stride = mask.strides()[size_t(nd - 1)];
  v.data = mask.raw_data();
  return true;
}

template <typename A>
struct SoftmaxArgs {
  void* y;         // forward output (null in the backward)
  A* stats;        // forward: may be null; backward: read
  bool* keep;      // the dropout applies when set, as on the CPU
  void* dx;        // backward output (null in the forward)
  const void* g;   // backward gradient
  const void* x;
  MaskView mask;
  Elem y_t, x_t, dx_t, g_t;
  int64_t rows, len;
  A scale, out_scale, drop_scale;
  uint64_t seed, offset;
  uint32_t threshold;
};

// v = x * scale + mask at column j of row r (mask_off: the row's mask offset).
template <typename A>
__device__ __forceinline__ A score(const SoftmaxArgs<A>& a, int64_t base, int64_t mask_off, int64_t j) {
  const A s = mul_rn(load_elem<A>(a.x, a.x_t, base + j), a.scale);
  if (!a.mask.data) return s;
  return add_rn(s, load_elem<A>(a.mask.data, a.mask.t, mask_off + j * a.mask.col_stride));
}

template <typename A, bool kBlock>
__global__ void scaled_masked_softmax_kernel(SoftmaxArgs<A> a) {
  using Team = RowTeam<kBlock>;
  const A ninf = -std::numeric_limits<A>::infinity();
  for (int64_t r = Team::first(); r < a.rows; r += Team::step()) {
    const int64_t base = r * a.len;
    const int64_t mask_off = a.mask.data ? a.mask.row_offset(r) : 0;
    A m = ninf;
    for (int64_t j = Team::lane(); j < a.len; j += Team::width()) m = MaxNan{}(m, score(a, base, mask_off, j));
    m = Team::reduce(m, MaxNan{}, ninf);
    A s = A(0);
    for (int64_t j = Team::lane(); j < a.len; j += Team::width()) s += d_exp(score(a, base, mask_off, j) - m);
    s = Team::reduce(s, Sum{}, A(0));
    const A inv = A(1.0 / double(s));
    if (a.stats && Team::lane() == 0) {
      a.stats[2 * r] = m;
      a.stats[2 * r + 1] = inv;
    }
    for (int64_t j = Team::lane(); j < a.len; j += Team::width()) {
      A yv = d_exp(score(a, base, mask_off, j) - m) * inv;
      if (a.keep) {
        const bool kept = cuda::dropout_keeps(a.seed, a.offset, uint64_t(base + j), a.threshold);
        a.keep[base + j] = kept;
        yv = yv * (kept ? a.drop_scale : A(0));
      }
      store_elem(a.y, a.y_t, base + j, yv);
    }
  }
}

// dx = out_scale * y * (g' - sum g' y), g' = the gradient through the dropout, y recomputed.
template <typename A, bool kBlock>
__global__ void scaled_masked_softmax_backward_kernel(SoftmaxArgs<A> a) {
  using Team = RowTeam<kBlock>;
  for (int64_t r = Team::first(); r < a.rows; r += Team::step()) {
    const int64_t base = r * a.len;
    const int64_t mask_off = a.mask.data ? a.mask.row_offset(r) : 0;
    const A m = a.stats[2 * r], inv = a.stats[2 * r + 1];
    A dot = A(0);
    for (int64_t j = Team::lane(); j < a.len; j += Team::width()) {
      const A yv = d_exp(score(a, base, mask_off, j) - m) * inv;
      A g = load_elem<A>(a.g, a.g_t, base + j);
      if (a.keep) g = g * (a.keep[base + j] ? a.drop_scale : A(0));
      dot += g * yv;
    }
    dot = Team::reduce(dot, Sum{}, A(0));
    for (int64_t j = Team::lane(); j < a.len; j += Team::width()) {
      const A yv = d_exp(score(a, base, mask_off, j) - m) * inv;
      A g = load_elem<A>(a.g, a.g_t, base + j);
      if (a.keep) g = g * (a.keep[base + j] ? a.drop_scale : A(0));
      store_elem(a.dx, a.dx_t, base + j, a.out_scale * (yv * (g - dot)));
    }
  }
}

// ---- host side

void check_rows(const Tensor& t, int64_t numel, const char* op, const char* what) {
  EMBER_CHECK(t.numel() == numel && t.is_contiguous(), op, ": ", what, " must be contiguous with ", numel,
              " elements, got shape ", t.shape());
}

// The rows of x over its last dim; zero when x is empty.
int64_t rows_over_last_dim(const Tensor& x, const char* op) {
  EMBER_CHECK(x.dim() >= 1, op, ": input must have at least one dim, got shape ", x.shape());
  const int64_t len = x.shape().back();
  return len == 0 ? 0 : x.numel() / len;
}

// The mask view of `mask` (or an empty one); `holder` keeps a contiguous copy alive when the
// mask has too many uneven dims to index directly.
MaskView mask_view(const Tensor& mask, const Tensor& x, const char* op, Tensor& holder) {
  MaskView v;
  if (!mask.defined()) return v;
  EMBER_CHECK(mask.shape() == x.shape(), op, ": mask of shape ", mask.shape(), " must be broadcast to the input of shape ",
              x.shape());
  v.t = elem_of(mask, op, "mask");
  if (!build_mask_view(mask, x.shape(), v)) {
    holder = native::contiguous(mask);
    v = MaskView{};
    v.t = elem_of(holder, op, "mask");
    EMBER_CHECK(build_mask_view(holder, x.shape(), v), op, ": cannot index the mask of shape ", mask.shape());
  }
  return v;
}

// The fields the forward and the backward both fill: the scores' inputs, stats and the keep mask.
template <typename A>
SoftmaxArgs<A> score_args(const Tensor& x, const MaskView& mv, const Tensor& stats, const Tensor& keep, int64_t rows,
                          int64_t len, double scale, const char* op) {
  SoftmaxArgs<A> a{};
  a.stats = stats.defined() ? static_cast<A*>(stats.raw_data()) : nullptr;
  a.keep = keep.defined() ? static_cast<bool*>(keep.raw_data()) : nullptr;
  a.x = x.raw_data();
  a.x_t = elem_of(x, op, "input");
  a.mask = mv;
  a.rows = rows;
  a.len = len;
  a.scale = A(scale);
  return a;
}

void scaled_masked_softmax_cuda(const Tensor& y, const Tensor& stats, const Tensor& keep, const Tensor& x,
                                const Tensor& mask, double scale, const FusedDropout& d) {
  constexpr const char* op = "scaled_masked_softmax";
  cuda::DeviceGuard guard(x.device(), op);
  const int64_t rows = rows_over_last_dim(x, op);
  if (rows == 0) return;
  const int64_t len = x.shape().back();
  check_rows(x, rows * len, op, "input");
  check_rows(y, rows * len, op, "output");
  check_keep(keep, rows * len, op);
  // the compute dtype: stats' when given, else f64 exactly for f64 data
  const DType cd = stats.defined() ? stats.dtype() : native::fused_compute_dtype(x.dtype());
  if (stats.defined()) check_rows(stats, rows * 2, op, "stats");
  Tensor holder;
  const MaskView mv = mask_view(mask, x, op, holder);
  const cudaStream_t stream = cuda::current_stream();
  visit_compute_type(cd, op, [&](auto tag) {
    using A = typename decltype(tag)::type;
    const Elem y_t = elem_of(y, op, "output");
    SoftmaxArgs<A> a = score_args<A>(x, mv, stats, keep, rows, len, scale, op);
    a.y = y.raw_data();
    a.y_t = y_t;
    a.out_scale = A(1);
    a.drop_scale = A(d.scale);
    a.seed = d.state.seed;
    a.offset = d.state.offset;
    a.threshold = d.active() ? cuda::dropout_threshold(d.p) : 0u;
    launch_rows(rows, len, [&](auto block, unsigned grid, int threads) {
      scaled_masked_softmax_kernel<A, decltype(block)::value><<<grid, threads, 0, stream>>>(a);
    });
  });
}

void scaled_masked_softmax_backward_cuda(const Tensor& dx, const Tensor& grad, const Tensor& x, const Tensor& mask,
                                         const Tensor& stats, const Tensor& keep, double scale, double out_scale,
                                         double dropout_scale) {
  constexpr const char* op = "scaled_masked_softmax_backward";
  if (!dx.defined()) return;
  cuda::DeviceGuard guard(x.device(), op);
  const int64_t rows = rows_over_last_dim(x, op);
  if (rows == 0) return;
  const int64_t len = x.shape().back();
  check_rows(x, rows * len, op, "input");
  check_rows(dx, rows * len, op, "dx");
  check_rows(grad, rows * len, op, "gradient");
  EMBER_CHECK(stats.defined(), op, ": stats is undefined (input of shape ", x.shape(), ")");
  check_rows(stats, rows * 2, op, "stats");
  check_keep(keep, rows * len, op);
  Tensor holder;
  const MaskView mv = mask_view(mask, x, op, holder);
  const cudaStream_t stream = cuda::current_stream();
  visit_compute_type(stats.dtype(), op, [&](auto tag) {
    using A = typename decltype(tag)::type;
    const Elem dx_t = elem_of(dx, op, "dx");
    const Elem g_t = elem_of(grad, op, "gradient");
    SoftmaxArgs<A> a = score_args<A>(x, mv, stats, keep, rows, len, scale, op);
    a.dx = dx.raw_data();
    a.dx_t = dx_t;
    a.g = grad.raw_data();
    a.g_t = g_t;
    a.out_scale = A(out_scale);
    a.drop_scale = A(dropout_scale);
    launch_rows(rows, len, [&](auto block, unsigned grid, int threads) {
      scaled_masked_softmax_backward_kernel<A, decltype(block)::value><<<grid, threads, 0, stream>>>(a);
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::scaled_masked_softmax_stub, CUDA, &scaled_masked_softmax_cuda);
EMBER_REGISTER_KERNEL(native::scaled_masked_softmax_backward_stub, CUDA, &scaled_masked_softmax_backward_cuda);

}  // namespace ember
