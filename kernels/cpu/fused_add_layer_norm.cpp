// CPU residual add + layer norm, forward and backward (core/native/fused.h).
//
// Each row is assembled in float directly in the saved h: x (f32, bf16 or f16) widened, the
// optional x bias added, the dropout applied (kernels/cpu/dropout_mask.h, the stream of
// native::dropout), the residual (f32, bf16 or f16) added; then the row statistics and y come
// from the same row while it is in L1 (kernels/cpu/layer_norm_rows.h, shared with layer_norm).
// Memory traffic: x and residual read once, h, y and the keep mask written once. f32 x and
// residual with no x bias or dropout between them are added and summed in one pass. Rows go
// through the statistics four at a time, as in layer_norm (a row's two sums are chains of
// dependent adds, which a group overlaps; a row's bits are the same alone or grouped).
//
// Backward: rows are cut into fixed chunks; each chunk writes dresidual, dx (= dresidual through
// the dropout) and its own partial sums for dweight, dbias and dx_bias, added in chunk order
// afterwards, so nothing depends on the thread count. f64 runs in double, row by row.
//
// Measured on AMD EPYC Zen 3 (AVX2), one thread, forward then backward of [2048, 256] f32 with
// weight and bias (build/bench/bench_ops BM_AddLayerNormFwdBwd, alternating with the previous
// library, best of 14 on a machine busy with other jobs, whose wall-clock figures scatter by 2x;
// by CPU time): 27.1 GB/s counted as 7 f32 words per element, against 19.4 GB/s before x and
// the residual were added in the sum's pass, row pointers and dtypes read once per call and the
// partial sums added across contiguous columns (the copy of x into h, the separate residual pass,
// the per-row dtype dispatch and the strided column sums had taken about a quarter). There x
// and residual are both leaves, whose gradient accumulators would copy one tensor they shared
// (a tenth of the time): autograd asks for two then, and the backward writes dx beside dresidual
// from the same registers (a row copy had taken 3% of the profile). With that and the forward
// fetching the next rows while a group's work stays in L1 (the forward kernel alone 350 against
// 380 us), on the Intel Xeon host (family 6 model 207), one thread, medians of runs alternated
// with the previous library: 20.5 GB/s against 18.6.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/native/fused.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/layer_norm_rows.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {

using namespace cpu::vec8;
using native::FusedDropout;

constexpr int64_t kRowsPerChunk = 32;

// ---- float rows of runtime-typed data (f32, bf16, f16)

template <typename Fn>
void with_lane_type(DType dt, const char* op, const Fn& fn) {
  switch (dt) {
    case DType::f32: return fn(type_tag<float>{});
    case DType::bf16: return fn(type_tag<BFloat16>{});
    case DType::f16: return fn(type_tag<Half>{});
    default: EMBER_FAIL(op, ": unexpected dtype ", dtype_name(dt));
  }
}

void load_row(DType dt, const void* src, float* dst, int64_t n) {
  with_lane_type(dt, "add_layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) std::memcpy(dst, src, size_t(n) * sizeof(float));
    else convert_row(dst, static_cast<const T*>(src), n);
  });
}

void store_row(DType dt, void* dst, const float* src, int64_t n) {
  with_lane_type(dt, "add_layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) std::memcpy(dst, src, size_t(n) * sizeof(float));
    else convert_row(static_cast<T*>(dst), src, n);
  });
}

// acc[j] += float(src[j])
void add_row(DType dt, const void* src, float* acc, int64_t n) {
  with_lane_type(dt, "add_layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* s = static_cast<const T*>(src);
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) store8(acc + i, load8(acc + i) + load8(s + i));
    for (; i < n; ++i) acc[i] += float(s[i]);
  });
}

void prefetch_row(const char* row, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
}

void add_float_row(float* acc, const float* b, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store8(acc + i, load8(acc + i) + load8(b + i));
  for (; i < n; ++i) acc[i] += b[i];
}

void forward_float(const Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& keep,
                   const Tensor& x, const Tensor& residual, const Tensor& x_bias, const Tensor& weight,
                   const Tensor& bias, double eps, const FusedDropout& d) {
  const int64_t rows = h.shape()[0], cols = h.shape()[1];
  const float* xb = x_bias.defined() ? x_bias.data_ptr<float>() : nullptr;
  const float* w = weight.defined() ? weight.data_ptr<float>() : nullptr;
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* hp = h.data_ptr<float>();
  float* mp = mean.data_ptr<float>();
  float* rp = rstd.data_ptr<float>();
  uint8_t* kp = keep.defined() ? reinterpret_cast<uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const uint32_t threshold = d.active() ? cpu::dropout_threshold(d.p) : 0;
  const DType x_dt = x.dtype(), res_dt = residual.dtype(), y_dt = y.dtype();
  const bool y_float = y_dt == DType::f32;
  // f32 x and residual with nothing between them: h = x + residual and its sum in one pass
  const bool plain_f32 = x_dt == DType::f32 && res_dt == DType::f32 && !xb && !kp;
  const char* x_base = static_cast<const char*>(x.raw_data());
  const char* res_base = static_cast<const char*>(residual.raw_data());
  char* y_base = static_cast<char*>(y.raw_data());
  const int64_t x_row = cols * int64_t(x.element_size()), res_row = cols * int64_t(residual.element_size()),
                y_row = cols * int64_t(y.element_size());
  const int64_t grain = std::max<int64_t>(1, 8192 / cols);
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> out_buf(y_float ? 0 : size_t(cols));
    // rows four at a time, so their statistics' chains of adds overlap (as layer_norm's)
    cpu::for_row_quads(r0, r1, [&](int64_t r, auto group) {
      constexpr int R = decltype(group)::value;
      float* hr[R];
      for (int k = 0; k < R; ++k) hr[k] = hp + (r + k) * cols;
      double sum[R];
      if (plain_f32) {
        const float* xr[R];
        const float* rr[R];
        for (int k = 0; k < R; ++k) {
          xr[k] = reinterpret_cast<const float*>(x_base + (r + k) * x_row);
          rr[k] = reinterpret_cast<const float*>(res_base + (r + k) * res_row);
        }
        cpu::add_rows_with_sums<R>(sum, hr, xr, rr, cols);
      } else {
        for (int k = 0; k < R; ++k) {
          const int64_t row = r + k;
          load_row(x_dt, x_base + row * x_row, hr[k], cols);
          if (xb) add_float_row(hr[k], xb, cols);
          if (kp) {
            cpu::dropout_keep_mask(d.state, threshold, row * cols, cols, kp + row * cols);
            cpu::apply_keep_mask(hr[k], hr[k], kp + row * cols, float(d.scale), cols);
          }
          add_row(res_dt, res_base + row * res_row, hr[k], cols);
        }
        cpu::layer_norm_rows_sums<R>(sum, hr, cols);
      }
      cpu::RowStats st[R];
      cpu::layer_norm_rows_stats_from_sums<R>(st, hr, sum, cols, eps);
      for (int k = 0; k < R; ++k) {
        const int64_t row = r + k;
        // the next group's rows, fetched while this one's work stays in L1 (the hardware's
        // prefetchers fetch only as far as the loads they see)
        if (plain_f32 && row + R < r1) {
          prefetch_row(x_base + (row + R) * x_row, x_row);
          prefetch_row(res_base + (row + R) * res_row, res_row);
        }
        mp[row] = st[k].mean;
        rp[row] = st[k].rstd;
        if (y_float) {
          cpu::layer_norm_apply_row(reinterpret_cast<float*>(y_base + row * y_row), hr[k], cols, st[k], w, b);
        } else {
          cpu::layer_norm_apply_row(out_buf.data(), hr[k], cols, st[k], w, b);
          store_row(y_dt, y_base + row * y_row, out_buf.data(), cols);
        }
      }
    });
  });
}

// Adds the per-chunk partial sums (nchunks rows of cols) column by column, chunks in order.
template <typename A, typename P>
void finish_partials(const P* part, int64_t nchunks, int64_t cols, const Tensor& out) {
  if (!out.defined()) return;
  A* o = out.data_ptr<A>();
  parallel_for(0, cols, 256, [&](int64_t j0, int64_t j1) {
    // chunk after chunk across a block of columns (contiguous, so it vectorises)
    std::vector<double> acc(size_t(j1 - j0), 0.0);
    for (int64_t c = 0; c < nchunks; ++c) {
      const P* p = part + c * cols;
      for (int64_t j = j0; j < j1; ++j) acc[size_t(j - j0)] += double(p[j]);
    }
    for (int64_t j = j0; j < j1; ++j) o[j] = A(acc[size_t(j - j0)]);
  });
}

void backward_float(const Tensor& dx, const Tensor& dres, const Tensor& dxb, const Tensor& dw, const Tensor& db,
                    const Tensor& grad, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                    const Tensor& keep, double dropout_scale) {
  const int64_t rows = h.shape()[0], cols = h.shape()[1];
  const int64_t nchunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  // per-chunk partial sums in this thread's scratch slots 0-2 (the chunks use slots 3-5)
  // (dweight and dbias in float: a chunk is only kRowsPerChunk rows, and the chunks add in double)
  auto partial = [&](const Tensor& t, int slot, auto zero) {
    using P = decltype(zero);
    if (!t.defined()) return static_cast<P*>(nullptr);
    return cpu::thread_scratch<P>(slot, size_t(nchunks * cols));
  };
  float* dw_part = partial(dw, 0, 0.0f);
  float* db_part = partial(db, 1, 0.0f);
  double* dxb_part = partial(dxb, 2, 0.0);
  const float* w = weight.defined() ? weight.data_ptr<float>() : nullptr;
  const float* hp = h.data_ptr<float>();
  const float* mp = mean.data_ptr<float>();
  const float* rp = rstd.data_ptr<float>();
  const uint8_t* kp = keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const bool want_dx = dx.defined() || dxb.defined();
  // row pointers and dtypes, read once (not per row)
  const DType grad_dt = grad.dtype();
  const DType dres_dt = dres.defined() ? dres.dtype() : DType::f32, dx_dt = dx.defined() ? dx.dtype() : DType::f32;
  const char* grad_base = static_cast<const char*>(grad.raw_data());
  char* dres_base = dres.defined() ? static_cast<char*>(dres.raw_data()) : nullptr;
  char* dx_base = dx.defined() ? static_cast<char*>(dx.raw_data()) : nullptr;
  const int64_t grad_row = cols * int64_t(grad.element_size());
  const int64_t dres_row = dres.defined() ? cols * int64_t(dres.element_size()) : 0;
  const int64_t dx_row = dx.defined() ? cols * int64_t(dx.element_size()) : 0;
  const bool grad_f32 = grad_dt == DType::f32, dres_f32 = dres_base && dres_dt == DType::f32,
             dx_f32 = dx_base && dx_dt == DType::f32;
  const float keep_scale = float(dropout_scale);
  const bool dh_in_dx = !kp && dx_f32 && !dres_f32;  // dx is dh itself: written there directly
  const bool dx_beside_dres = !kp && dx_f32 && dres_f32;  // dx a copy of dres, written in the same loop
  parallel_for(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
    const size_t n = static_cast<size_t>(cols);
    float* g = cpu::thread_scratch<float>(3, n);
    float* dh = cpu::thread_scratch<float>(4, n);
    float* dxr = cpu::thread_scratch<float>(5, n);
    for (int64_t c = c0; c < c1; ++c) {
      float* dwc = dw_part ? dw_part + c * cols : nullptr;
      float* dbc = db_part ? db_part + c * cols : nullptr;
      double* dxbc = dxb_part ? dxb_part + c * cols : nullptr;
      // each chunk zeroes its own partial sums (in parallel, and into this core's cache)
      if (dwc) std::fill(dwc, dwc + cols, 0.0f);
      if (dbc) std::fill(dbc, dbc + cols, 0.0f);
      if (dxbc) std::fill(dxbc, dxbc + cols, 0.0);
      for (int64_t r = c * kRowsPerChunk; r < std::min(rows, (c + 1) * kRowsPerChunk); ++r) {
        // f32 rows are read and written in place, other dtypes through the row buffers
        const float* gr = g;
        if (grad_f32) gr = reinterpret_cast<const float*>(grad_base + r * grad_row);
        else load_row(grad_dt, grad_base + r * grad_row, g, cols);
        float* dhr = dres_f32   ? reinterpret_cast<float*>(dres_base + r * dres_row)
                     : dh_in_dx ? reinterpret_cast<float*>(dx_base + r * dx_row)
                                : dh;
        float* dx_copy = dx_beside_dres ? reinterpret_cast<float*>(dx_base + r * dx_row) : nullptr;
        cpu::layer_norm_backward_row(dhr, gr, hp + r * cols, cols, {mp[r], rp[r]}, w, dwc, dbc, dx_copy);
        if (dres_base && !dres_f32) store_row(dres_dt, dres_base + r * dres_row, dhr, cols);
        if (!want_dx) continue;
        const float* d = dhr;
        if (kp) {
          // straight into dx when it is f32
          float* out = dx_f32 ? reinterpret_cast<float*>(dx_base + r * dx_row) : dxr;
          cpu::apply_keep_mask(out, dhr, kp + r * cols, keep_scale, cols);
          d = out;
          if (dx_base && !dx_f32) store_row(dx_dt, dx_base + r * dx_row, d, cols);
        } else if (dx_base && !dh_in_dx && !dx_beside_dres) {
          store_row(dx_dt, dx_base + r * dx_row, d, cols);
        }
        if (dxbc)
          for (int64_t j = 0; j < cols; ++j) dxbc[j] += double(d[j]);
      }
    }
  });
  finish_partials<float>(dw_part, nchunks, cols, dw);
  finish_partials<float>(db_part, nchunks, cols, db);
  finish_partials<float>(dxb_part, nchunks, cols, dxb);
}

// ---- f64: the same steps in double, written plainly

void forward_double(const Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& keep,
                    const Tensor& x, const Tensor& residual, const Tensor& x_bias, const Tensor& weight,
                    const Tensor& bias, double eps, const FusedDropout& d) {
  const int64_t rows = h.shape()[0], cols = h.shape()[1];
  const double* xp = x.data_ptr<double>();
  const double* resp = residual.data_ptr<double>();
  const double* xb = x_bias.defined() ? x_bias.data_ptr<double>() : nullptr;
  const double* w = weight.defined() ? weight.data_ptr<double>() : nullptr;
  const double* b = bias.defined() ? bias.data_ptr<double>() : nullptr;
  double* hp = h.data_ptr<double>();
  double* yp = y.data_ptr<double>();
  uint8_t* kp = keep.defined() ? reinterpret_cast<uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const uint32_t threshold = d.active() ? cpu::dropout_threshold(d.p) : 0;
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double* hr = hp + r * cols;
      if (kp) cpu::dropout_keep_mask(d.state, threshold, r * cols, cols, kp + r * cols);
      double s = 0;
      for (int64_t j = 0; j < cols; ++j) {
        double v = xp[r * cols + j] + (xb ? xb[j] : 0.0);
        if (kp) v *= kp[r * cols + j] ? d.scale : 0.0;
        hr[j] = v + resp[r * cols + j];
        s += hr[j];
      }
      const double m = s / double(cols);
      double ss = 0;
      for (int64_t j = 0; j < cols; ++j) ss += (hr[j] - m) * (hr[j] - m);
      const double rs = 1.0 / std::sqrt(ss / double(cols) + eps);
      mean.data_ptr<double>()[r] = m;
      rstd.data_ptr<double>()[r] = rs;
      for (int64_t j = 0; j < cols; ++j) yp[r * cols + j] = (hr[j] - m) * rs * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
    }
  });
}

void backward_double(const Tensor& dx, const Tensor& dres, const Tensor& dxb, const Tensor& dw, const Tensor& db,
                     const Tensor& grad, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                     const Tensor& keep, double dropout_scale) {
  const int64_t rows = h.shape()[0], cols = h.shape()[1];
  const double* gp = grad.data_ptr<double>();
  const double* hp = h.data_ptr<double>();
  const double* w = weight.defined() ? weight.data_ptr<double>() : nullptr;
  const uint8_t* kp = keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const size_t n = static_cast<size_t>(cols);
  std::vector<double> sw(n, 0.0), sb(n, 0.0), sxb(n, 0.0), dh(n);
  for (int64_t r = 0; r < rows; ++r) {
    const double m = mean.data_ptr<double>()[r], rs = rstd.data_ptr<double>()[r];
    const double* g = gp + r * cols;
    const double* hr = hp + r * cols;
    double a = 0, c = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double xhat = (hr[j] - m) * rs, gw = g[j] * (w ? w[j] : 1.0);
      a += gw;
      c += gw * xhat;
      sw[size_t(j)] += g[j] * xhat;
      sb[size_t(j)] += g[j];
    }
    a /= double(cols);
    c /= double(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const double xhat = (hr[j] - m) * rs, gw = g[j] * (w ? w[j] : 1.0);
      dh[size_t(j)] = rs * (gw - a - xhat * c);
      if (dres.defined()) dres.data_ptr<double>()[r * cols + j] = dh[size_t(j)];
      const double dxv = kp ? dh[size_t(j)] * (kp[r * cols + j] ? dropout_scale : 0.0) : dh[size_t(j)];
      if (dx.defined()) dx.data_ptr<double>()[r * cols + j] = dxv;
      sxb[size_t(j)] += dxv;
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    if (dw.defined()) dw.data_ptr<double>()[j] = sw[size_t(j)];
    if (db.defined()) db.data_ptr<double>()[j] = sb[size_t(j)];
    if (dxb.defined()) dxb.data_ptr<double>()[j] = sxb[size_t(j)];
  }
}

void add_layer_norm_cpu(const Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& keep,
                        const Tensor& x, const Tensor& residual, const Tensor& x_bias, const Tensor& weight,
                        const Tensor& bias, double eps, const FusedDropout& d) {
  if (h.dtype() == DType::f64) forward_double(y, h, mean, rstd, keep, x, residual, x_bias, weight, bias, eps, d);
  else forward_float(y, h, mean, rstd, keep, x, residual, x_bias, weight, bias, eps, d);
}

void add_layer_norm_backward_cpu(const Tensor& dx, const Tensor& dres, const Tensor& dxb, const Tensor& dw,
                                 const Tensor& db, const Tensor& grad, const Tensor& h, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& weight, const Tensor& keep, double dropout_scale) {
  if (h.dtype() == DType::f64) backward_double(dx, dres, dxb, dw, db, grad, h, mean, rstd, weight, keep, dropout_scale);
  else backward_float(dx, dres, dxb, dw, db, grad, h, mean, rstd, weight, keep, dropout_scale);
}

}  // namespace

EMBER_REGISTER_KERNEL(native::add_layer_norm_stub, CPU, &add_layer_norm_cpu);
EMBER_REGISTER_KERNEL(native::add_layer_norm_backward_stub, CPU, &add_layer_norm_backward_cpu);

}  // namespace ember
