// CUDA residual add + layer norm, forward and backward, on the stubs of core/native/fused.h.
// Semantics match kernels/cpu/fused_add_layer_norm.cpp:
//   h = dropout(x + x_bias) + residual,  y = (h - mean) * rstd * weight + bias,
// computed in float for f32, bf16 and f16 data and in double for f64, with h, mean and rstd
// saved in that compute type and the dropout's keep mask as bool.
//
// x, residual, y, the gradient and dx / dresidual each come in their own dtype (the op mixes
// them freely), so elements are read and written through a dtype code switched on per access,
// one kernel per compute type instead of one per combination of four dtypes. The switch is the
// same for every thread; these kernels are bound by memory, not by that branch.
//
// h is assembled with explicitly rounded adds and multiplies (no FMA contraction), so it is
// the CPU's h operation for operation. The dropout keeps element e = row * cols + col exactly
// as the CPU does (kernels/cuda/philox.cuh).
//
// Rows go to one warp each up to 1024 columns and to one block each above; sums are
// warp-shuffle reductions (joined through shared memory across the warps of a block).
// Backward: one team per row writes dresidual and dx and, when dx_bias is wanted, the row's two
// coefficients (mean(g w) and mean(g w xhat)) into a small buffer. dweight, dbias and dx_bias
// are column sums over the rows (column_sums.cuh, as layer norm's dweight in
// kernels/cuda/normalization.cu): fixed chunks of rows summed in double, then the chunks in
// order, so there are no atomics and the results do not change from run to run. dx_bias
// recomputes dx from the saved coefficients with the same rounded operations the row kernel
// uses, so it sums exactly the values of dx.
#include <cstdint>
#include <type_traits>

#include "core/factory.h"
#include "core/native/fused.h"
#include "kernels/cuda/column_sums.cuh"
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

// row teams (row_reduce.cuh), dtype-coded element access and rounded operations (dtype_io.cuh)
using namespace cuda;

// ---- forward

template <typename A>
struct ForwardArgs {
  void* y;  // each output may be null
  A* h;
  A* mean;
  A* rstd;
  bool* keep;  // the dropout applies when set, as on the CPU
  const void* x;
  const void* res;
  const A* x_bias;  // null: zeros
  const A* w;       // null: ones
  const A* b;       // null: zeros
  Elem y_t, x_t, res_t;
  int64_t rows, cols;
  double eps;
  A drop_scale;
  uint64_t seed, offset;
  uint32_t threshold;
};

// h at element e = row * cols + j, the CPU's operations in its order.
template <typename A>
__device__ __forceinline__ A h_value(const ForwardArgs<A>& a, int64_t e, int64_t j, bool& kept) {
  A v = load_elem<A>(a.x, a.x_t, e);
  if (a.x_bias) v = add_rn(v, a.x_bias[j]);
  if (a.keep) {
    kept = cuda::dropout_keeps(a.seed, a.offset, uint64_t(e), a.threshold);
    v = mul_rn(v, kept ? a.drop_scale : A(0));
  }
  return add_rn(v, load_elem<A>(a.res, a.res_t, e));
}

// Statistics in two passes over the row (mean, then squared deviations): no cancellation. The
// later passes read h back from memory (the same thread wrote it) or, when h is not saved,
// recompute it bit for bit.
template <typename A, bool kBlock>
__global__ void add_layer_norm_kernel(ForwardArgs<A> a) {
  using Team = RowTeam<kBlock>;
  const A inv_cols = A(1) / A(a.cols);
  for (int64_t r = Team::first(); r < a.rows; r += Team::step()) {
    const int64_t base = r * a.cols;
    A s = A(0);
    for (int64_t j = Team::lane(); j < a.cols; j += Team::width()) {
      bool kept = true;
      const A v = h_value(a, base + j, j, kept);
      if (a.keep) a.keep[base + j] = kept;
      if (a.h) a.h[base + j] = v;
      s += v;
    }
    const A mean = Team::reduce(s, Sum{}, A(0)) * inv_cols;
    A ss = A(0);
    for (int64_t j = Team::lane(); j < a.cols; j += Team::width()) {
      bool kept = true;
      const A d = (a.h ? a.h[base + j] : h_value(a, base + j, j, kept)) - mean;
      ss += d * d;
    }
    const A var = Team::reduce(ss, Sum{}, A(0)) * inv_cols;
    const A rstd = A(1.0 / sqrt(double(var) + a.eps));
    if (Team::lane() == 0) {
      if (a.mean) a.mean[r] = mean;
      if (a.rstd) a.rstd[r] = rstd;
    }
    if (!a.y) continue;
    for (int64_t j = Team::lane(); j < a.cols; j += Team::width()) {
      bool kept = true;
      A v = ((a.h ? a.h[base + j] : h_value(a, base + j, j, kept)) - mean) * rstd;
      if (a.w) v = v * a.w[j];
      if (a.b) v = v + a.b[j];
      store_elem(a.y, a.y_t, base + j, v);
    }
  }
}

// ---- backward

template <typename A>
struct BackwardArgs {
  void* dx;    // may be null
  void* dres;  // may be null
  A* coef;     // [rows, 2]: mean(g w), mean(g w xhat) per row; may be null
  const void* g;
  const A* h;
  const A* mean;
  const A* rstd;
  const A* w;        // null: ones
  const bool* keep;  // null: no dropout
  Elem dx_t, dres_t, g_t;
  int64_t rows, cols;
  A drop_scale;
};

// dh = rstd * (g w - a - xhat c), rounded step by step so every kernel gets the same value.
template <typename A>
__device__ __forceinline__ A dh_value(A gw, A xhat, A a, A c, A rstd) {
  return mul_rn(rstd, sub_rn(sub_rn(gw, a), mul_rn(xhat, c)));
}

template <typename A>
__device__ __forceinline__ A xhat_value(A h, A mean, A rstd) {
  return mul_rn(sub_rn(h, mean), rstd);
}

template <typename A, bool kBlock>
__global__ void add_layer_norm_backward_rows_kernel(BackwardArgs<A> p) {
  using Team = RowTeam<kBlock>;
  const A inv_cols = A(1) / A(p.cols);
  for (int64_t r = Team::first(); r < p.rows; r += Team::step()) {
    const int64_t base = r * p.cols;
    const A m = p.mean[r], rs = p.rstd[r];
    A sum_gw = A(0), sum_gw_xhat = A(0);
    for (int64_t j = Team::lane(); j < p.cols; j += Team::width()) {
      const A g = load_elem<A>(p.g, p.g_t, base + j);
      const A gw = p.w ? mul_rn(g, p.w[j]) : g;
      sum_gw += gw;
      sum_gw_xhat += gw * xhat_value(p.h[base + j], m, rs);
    }
    const A a = Team::reduce(sum_gw, Sum{}, A(0)) * inv_cols;
    const A c = Team::reduce(sum_gw_xhat, Sum{}, A(0)) * inv_cols;
    if (p.coef && Team::lane() == 0) {
      p.coef[2 * r] = a;
      p.coef[2 * r + 1] = c;
    }
    if (!p.dx && !p.dres) continue;
    for (int64_t j = Team::lane(); j < p.cols; j += Team::width()) {
      const A g = load_elem<A>(p.g, p.g_t, base + j);
      const A gw = p.w ? mul_rn(g, p.w[j]) : g;
      const A dh = dh_value(gw, xhat_value(p.h[base + j], m, rs), a, c, rs);
      if (p.dres) store_elem(p.dres, p.dres_t, base + j, dh);
      if (p.dx) store_elem(p.dx, p.dx_t, base + j, p.keep ? mul_rn(dh, p.keep[base + j] ? p.drop_scale : A(0)) : dh);
    }
  }
}

// dweight = sum_rows g xhat, dbias = sum_rows g, dx_bias = sum_rows dx (from the coefficients
// in p.coef), per element for column_sums: values 0, 1, 2 (zeros for the sums not wanted).
template <typename A>
struct ColumnSumValues {
  BackwardArgs<A> p;
  bool want_dw, want_dxb;
  __device__ __forceinline__ void operator()(int64_t r, int64_t j, double (&v)[3]) const {
    const int64_t e = r * p.cols + j;
    const A g = load_elem<A>(p.g, p.g_t, e);
    v[0] = 0.0;
    v[1] = double(g);
    v[2] = 0.0;
    if (want_dw || want_dxb) {
      const A rs = p.rstd[r];
      const A xhat = xhat_value(p.h[e], p.mean[r], rs);
      v[0] = double(mul_rn(g, xhat));
      if (want_dxb) {
        const A gw = p.w ? mul_rn(g, p.w[j]) : g;
        const A dh = dh_value(gw, xhat, p.coef[2 * r], p.coef[2 * r + 1], rs);
        v[2] = double(p.keep ? mul_rn(dh, p.keep[e] ? p.drop_scale : A(0)) : dh);
      }
    }
  }
};

// ---- host side

template <typename A>
A* optional_ptr(const Tensor& t) {
  return t.defined() ? static_cast<A*>(t.raw_data()) : nullptr;
}

// A defined tensor of the compute dtype with `numel` elements, or undefined.
void check_compute(const Tensor& t, DType cd, int64_t numel, const char* op, const char* what) {
  if (!t.defined()) return;
  EMBER_CHECK(t.dtype() == cd && t.numel() == numel && t.is_contiguous(), op, ": ", what, " must be contiguous ",
              dtype_name(cd), " with ", numel, " elements, got ", dtype_name(t.dtype()), " of shape ", t.shape());
}

void check_rows(const Tensor& t, int64_t numel, const char* op, const char* what) {
  if (!t.defined()) return;
  EMBER_CHECK(t.numel() == numel && t.is_contiguous(), op, ": ", what, " must be contiguous with ", numel,
              " elements, got shape ", t.shape());
}

void add_layer_norm_cuda(const Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& keep,
                         const Tensor& x, const Tensor& residual, const Tensor& x_bias, const Tensor& weight,
                         const Tensor& bias, double eps, const FusedDropout& d) {
  constexpr const char* op = "add_layer_norm";
  cuda::DeviceGuard guard(x.device(), op);
  // x keeps its own shape; h [rows, cols] (or, without h, the per-row statistics) fixes the rows
  const Tensor& geometry = h.defined() ? h : (mean.defined() ? mean : rstd);
  EMBER_CHECK(geometry.defined(), op, ": h, mean or rstd must be given (input of shape ", x.shape(), ")");
  EMBER_CHECK(!h.defined() || h.dim() == 2, op, ": h must be [rows, cols], got shape ", h.shape());
  const int64_t rows = h.defined() ? h.shape()[0] : geometry.numel();
  const int64_t cols = h.defined() ? h.shape()[1] : (rows == 0 ? 0 : x.numel() / rows);
  if (rows == 0 || cols == 0) return;
  const DType cd = geometry.dtype();
  check_rows(x, rows * cols, op, "input");
  check_rows(residual, rows * cols, op, "residual");
  check_rows(y, rows * cols, op, "output");
  check_compute(h, cd, rows * cols, op, "h");
  check_compute(mean, cd, rows, op, "mean");
  check_compute(rstd, cd, rows, op, "rstd");
  check_compute(x_bias, cd, cols, op, "x_bias");
  check_compute(weight, cd, cols, op, "weight");
  check_compute(bias, cd, cols, op, "bias");
  cuda::check_keep(keep, rows * cols, op);
  const cudaStream_t stream = cuda::current_stream();
  visit_compute_type(cd, op, [&](auto tag) {
    using A = typename decltype(tag)::type;
    ForwardArgs<A> a{};
    a.y = y.defined() ? y.raw_data() : nullptr;
    a.y_t = y.defined() ? elem_of(y, op, "output") : Elem::f32;
    a.h = optional_ptr<A>(h);
    a.mean = optional_ptr<A>(mean);
    a.rstd = optional_ptr<A>(rstd);
    a.keep = keep.defined() ? static_cast<bool*>(keep.raw_data()) : nullptr;
    a.x = x.raw_data();
    a.x_t = elem_of(x, op, "input");
    a.res = residual.raw_data();
    a.res_t = elem_of(residual, op, "residual");
    a.x_bias = optional_ptr<const A>(x_bias);
    a.w = optional_ptr<const A>(weight);
    a.b = optional_ptr<const A>(bias);
    a.rows = rows;
    a.cols = cols;
    a.eps = eps;
    a.drop_scale = A(d.scale);
    a.seed = d.state.seed;
    a.offset = d.state.offset;
    a.threshold = d.active() ? cuda::dropout_threshold(d.p) : 0u;
    launch_rows(rows, cols, [&](auto block, unsigned grid, int threads) {
      add_layer_norm_kernel<A, decltype(block)::value><<<grid, threads, 0, stream>>>(a);
    });
  });
}

void add_layer_norm_backward_cuda(const Tensor& dx, const Tensor& dres, const Tensor& dxb, const Tensor& dw,
                                  const Tensor& db, const Tensor& grad, const Tensor& h, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& weight, const Tensor& keep, double dropout_scale) {
  constexpr const char* op = "add_layer_norm_backward";
  if (!dx.defined() && !dres.defined() && !dxb.defined() && !dw.defined() && !db.defined()) return;
  cuda::DeviceGuard guard(h.device(), op);
  EMBER_CHECK(h.dim() == 2, op, ": h must be [rows, cols], got shape ", h.shape());
  const int64_t rows = h.shape()[0], cols = h.shape()[1];
  if (cols == 0) return;
  const DType cd = h.dtype();
  check_compute(h, cd, rows * cols, op, "h");
  check_compute(mean, cd, rows, op, "mean");
  check_compute(rstd, cd, rows, op, "rstd");
  check_compute(weight, cd, cols, op, "weight");
  check_compute(dxb, cd, cols, op, "dx_bias");
  check_compute(dw, cd, cols, op, "dweight");
  check_compute(db, cd, cols, op, "dbias");
  check_rows(grad, rows * cols, op, "gradient");
  check_rows(dx, rows * cols, op, "dx");
  check_rows(dres, rows * cols, op, "dresidual");
  cuda::check_keep(keep, rows * cols, op);
  const cudaStream_t stream = cuda::current_stream();
  visit_compute_type(cd, op, [&](auto tag) {
    using A = typename decltype(tag)::type;
    // the row coefficients dx_bias recomputes dx from (freed after the launches: the caching
    // allocator hands the block out again only on this stream, after these kernels)
    const Tensor coef = dxb.defined() && rows > 0 ? empty({rows, 2}, {cd, h.device()}) : Tensor();
    BackwardArgs<A> p{};
    p.dx = dx.defined() ? dx.raw_data() : nullptr;
    p.dx_t = dx.defined() ? elem_of(dx, op, "dx") : Elem::f32;
    p.dres = dres.defined() ? dres.raw_data() : nullptr;
    p.dres_t = dres.defined() ? elem_of(dres, op, "dresidual") : Elem::f32;
    p.coef = optional_ptr<A>(coef);
    p.g = rows > 0 ? grad.raw_data() : nullptr;
    p.g_t = elem_of(grad, op, "gradient");
    p.h = optional_ptr<const A>(h);
    p.mean = optional_ptr<const A>(mean);
    p.rstd = optional_ptr<const A>(rstd);
    p.w = optional_ptr<const A>(weight);
    p.keep = keep.defined() ? static_cast<const bool*>(keep.raw_data()) : nullptr;
    p.rows = rows;
    p.cols = cols;
    p.drop_scale = A(dropout_scale);
    if (rows > 0 && (p.dx || p.dres || p.coef)) {
      launch_rows(rows, cols, [&](auto block, unsigned grid, int threads) {
        add_layer_norm_backward_rows_kernel<A, decltype(block)::value><<<grid, threads, 0, stream>>>(p);
      });
    }
    if (dw.defined() || db.defined() || dxb.defined()) {
      const ColumnSumValues<A> values{p, dw.defined(), dxb.defined()};
      column_sums<3, A>({{optional_ptr<A>(dw), optional_ptr<A>(db), optional_ptr<A>(dxb)}}, rows, cols, values,
                        h.device(), stream);
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::add_layer_norm_stub, CUDA, &add_layer_norm_cuda);
EMBER_REGISTER_KERNEL(native::add_layer_norm_backward_stub, CUDA, &add_layer_norm_backward_cuda);

}  // namespace ember
