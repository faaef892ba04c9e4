// CPU convolutions: im2col + Ember's GEMM (kernels/cpu/gemm.h), per image and per group.
//
//   forward:          out[n, g]  [Og, Ho*Wo] = W_g [Og, Cg*kH*kW] @ col(x[n, g]) [Cg*kH*kW, Ho*Wo]
//   backward input:   dx[n, g]             = col2im(W_g^T @ dY[n, g])
//   backward weight:  dW_g                 = sum over n of dY[n, g] @ col(x[n, g])^T
//
// A 1x1, stride-1, unpadded convolution needs no column buffer: x[n, g] is its own col. With
// unit strides and Wo == W every col row is one contiguous run of x (ShiftedRow), moved whole.
// Batches of at least as many images as threads run image by image in parallel (each GEMM then
// single-threaded); smaller ones run one image at a time with the GEMM itself threaded. Column
// buffers and the weight gradient's per-thread partial sums live in per-thread scratch
// (kernels/cpu/scratch.h), reused from call to call. bf16 and f16 run in f32 and are rounded
// once on the way out, as linalg's f16 products are.
//
// f32 passes that oneDNN's blocked kernels run faster, reorders included, go to oneDNN instead,
// and one-channel 3x3 and 5x5 forward passes (with AVX-512, their weight gradients too) to a
// direct kernel (convolution_path.h has the measurements and the choice;
// convolution_onednn.cpp, convolution_direct.cpp and convolution_direct_weight.cpp the paths).
// On this path, an f32 1x1 convolution with a stride or padding skips the column buffer: its
// forward and weight gradient gather straight into the GEMM micro-kernel's panels, and its
// input gradient multiplies a few output rows at a time into a tile it spreads into dX
// (convolution_pointwise.h); in other dtypes the input gradient writes each input row once
// (col2im_disjoint). Lowering several images into one GEMM (columns
// [Cg*kH*kW, images*Ho*Wo], results scattered back to NCHW) was measured and did not pay on
// these shapes: the gather/scatter copies cost what the wider GEMM saved, and on 1-channel
// layers (k = 9) the GEMM is bound by writing its result, which the scatter doubles.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/native/convolution.h"
#include "core/native/copy.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/convolution_direct.h"
#include "kernels/cpu/convolution_onednn.h"
#include "kernels/cpu/convolution_path.h"
#include "kernels/cpu/convolution_pointwise.h"
#include "kernels/cpu/convolution_weight_chunks.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec8.h"

namespace ember {
namespace {

using native::Conv2dParams;

// Scratch slots: the caller's partial sums, and each image's column buffer.
constexpr int kPartialsSlot = 0;
constexpr int kColumnSlot = 1;

// The sizes of one convolution, read from its 4-D tensors: x [N, C, H, W], w [O, Cg, kH, kW],
// y [N, O, Ho, Wo].
struct Geometry {
  int64_t batch, channels, height, width, out_channels, kernel_h, kernel_w, out_h, out_w, groups;
  Conv2dParams p;
  int64_t group_channels() const { return channels / groups; }
  int64_t group_out_channels() const { return out_channels / groups; }
  int64_t col_rows() const { return group_channels() * kernel_h * kernel_w; }
  int64_t out_area() const { return out_h * out_w; }
  int64_t in_area() const { return height * width; }
  bool direct() const {
    return kernel_h == 1 && kernel_w == 1 && p.stride[0] == 1 && p.stride[1] == 1 && p.padding_begin[0] == 0 &&
           p.padding_begin[1] == 0 && out_h == height && out_w == width;
  }
};

Geometry geometry_of(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  return {x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], w.shape()[0], w.shape()[2], w.shape()[3],
          y.shape()[2], y.shape()[3], p.groups, p};
}

// The output columns [lo, hi) whose input column ow * stride - pad + offset lies in [0, size).
std::pair<int64_t, int64_t> valid_range(int64_t out_size, int64_t size, int64_t stride, int64_t start) {
  // start = -pad + offset; need 0 <= ow * stride + start < size.
  const int64_t lo = start >= 0 ? 0 : (-start + stride - 1) / stride;
  const int64_t hi = start >= size ? 0 : (size - start + stride - 1) / stride;
  return {std::min(lo, out_size), std::clamp<int64_t>(hi, std::min(lo, out_size), out_size)};
}

// Visits every (col row, output row) pair of one image's column matrix (rows `ld` apart) with
// the input row it reads (-1 when it lies in the padding) and the valid output columns, so
// im2col and col2im share one walk over the geometry.
template <typename Visit>
void walk_columns(const Geometry& g, int64_t ld, const Visit& visit) {
  const auto& p = g.p;
  for (int64_t c = 0; c < g.group_channels(); ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const int64_t row = (c * g.kernel_h + kh) * g.kernel_w + kw;
        const int64_t col_start = kw * p.dilation[1] - p.padding_begin[1];
        const auto [lo, hi] = valid_range(g.out_w, g.width, p.stride[1], col_start);
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * p.stride[0] - p.padding_begin[0] + kh * p.dilation[0];
          const bool inside = ih >= 0 && ih < g.height;
          visit(row * ld + oh * g.out_w, inside ? (c * g.height + ih) * g.width + col_start : -1, lo,
                inside ? hi : lo);
        }
      }
}

// With unit strides and Wo == W, output position (oh, ow) of col row (c, kh, kw) reads input
// element (oh * W + ow) + shift of x: each col row is one contiguous run of x, with the entries
// that wrap around a row edge (ow outside [lo, hi)) and the rows outside [oh_lo, oh_hi) in the
// padding. im2col and col2im then move whole runs instead of Wo-long pieces.
struct ShiftedRow {
  int64_t row, shift, oh_lo, oh_hi, lo, hi;
  bool empty() const { return oh_lo >= oh_hi || lo >= hi; }
  int64_t first() const { return oh_lo * width + lo; }      // the run [first, last) in col
  int64_t last() const { return (oh_hi - 1) * width + hi; }
  int64_t width;
};

bool unit_stride_full_width(const Geometry& g) {
  return g.p.stride[0] == 1 && g.p.stride[1] == 1 && g.out_w == g.width;
}

template <typename Visit>
void walk_shifted_rows(const Geometry& g, const Visit& visit) {
  const auto& p = g.p;
  for (int64_t c = 0; c < g.group_channels(); ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const int64_t dy = kh * p.dilation[0] - p.padding_begin[0], dx = kw * p.dilation[1] - p.padding_begin[1];
        const auto [oh_lo, oh_hi] = valid_range(g.out_h, g.height, 1, dy);
        const auto [lo, hi] = valid_range(g.out_w, g.width, 1, dx);
        visit(ShiftedRow{(c * g.kernel_h + kh) * g.kernel_w + kw, (c * g.height + dy) * g.width + dx, oh_lo, oh_hi,
                         lo, hi, g.width});
      }
}

// d[ow] = s[2 * ow] for ow in [lo, hi), reading no further than s[readable - 1]: a stride-2
// window's columns, eight at a time from two loads (the scalar loop gathers one by one).
template <typename T>
void gather_every_other(T* d, const T* s, int64_t lo, int64_t hi, int64_t readable) {
  int64_t ow = lo;
  if constexpr (std::is_same_v<T, float>)
    for (; ow + 8 <= hi && 2 * ow + 16 <= readable; ow += 8) {
      const cpu::vec8::f8 a = cpu::vec8::load8(s + 2 * ow), b = cpu::vec8::load8(s + 2 * ow + 8);
      cpu::vec8::store8(d + ow, __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14));
    }
  for (; ow < hi; ++ow) d[ow] = s[2 * ow];
}

// col [Cg*kH*kW, Ho*Wo] (rows `ld` apart) from x [Cg, H, W].
template <typename T>
void im2col(const Geometry& g, const T* x, T* col, int64_t ld) {
  const int64_t stride = g.p.stride[1], out_w = g.out_w, area = g.out_area();
  if (unit_stride_full_width(g)) {
    walk_shifted_rows(g, [&](const ShiftedRow& r) {
      T* d = col + r.row * ld;
      if (r.empty()) {
        std::fill(d, d + area, T(0));
        return;
      }
      std::fill(d, d + r.first(), T(0));
      std::copy(x + r.first() + r.shift, x + r.last() + r.shift, d + r.first());
      std::fill(d + r.last(), d + area, T(0));
      if (r.lo > 0 || r.hi < out_w)  // the entries that wrapped around a row edge
        for (int64_t oh = r.oh_lo; oh < r.oh_hi; ++oh) {
          std::fill(d + oh * out_w, d + oh * out_w + r.lo, T(0));
          std::fill(d + oh * out_w + r.hi, d + (oh + 1) * out_w, T(0));
        }
    });
    return;
  }
  const int64_t readable = g.group_channels() * g.in_area();
  walk_columns(g, ld, [&](int64_t dst, int64_t src, int64_t lo, int64_t hi) {
    T* d = col + dst;
    std::fill(d, d + lo, T(0));
    if (stride == 1) {
      if (hi > lo) std::memcpy(d + lo, x + src + lo, size_t(hi - lo) * sizeof(T));
    } else if (stride == 2) {
      gather_every_other(d, x + src, lo, hi, readable - src);
    } else {
      for (int64_t ow = lo; ow < hi; ++ow) d[ow] = x[src + ow * stride];
    }
    std::fill(d + std::max(lo, hi), d + out_w, T(0));
  });
}

// x [Cg, H, W] += the columns of col (rows `ld` apart) scattered back to where im2col read them.
// May zero the entries of col that read the padding.
template <typename T>
void col2im(const Geometry& g, T* col, T* x, int64_t ld) {
  const int64_t stride = g.p.stride[1], out_w = g.out_w;
  if (unit_stride_full_width(g)) {
    walk_shifted_rows(g, [&](const ShiftedRow& r) {
      if (r.empty()) return;
      T* s = col + r.row * ld;
      // Zero the wrapped entries inside the run, which then adds as one piece.
      if (r.lo > 0 || r.hi < out_w)
        for (int64_t oh = r.oh_lo; oh + 1 < r.oh_hi; ++oh)
          std::fill(s + oh * out_w + r.hi, s + (oh + 1) * out_w + r.lo, T(0));
      for (int64_t i = r.first(); i < r.last(); ++i) x[i + r.shift] += s[i];
    });
    return;
  }
  walk_columns(g, ld, [&](int64_t src, int64_t dst, int64_t lo, int64_t hi) {
    const T* s = col + src;
    T* d = x + dst;
    if (stride == 1) {
      for (int64_t ow = lo; ow < hi; ++ow) d[ow] += s[ow];  // unit stride: vectorised
    } else {
      for (int64_t ow = lo; ow < hi; ++ow) d[ow * stride] += s[ow];
    }
  });
}

// An unpadded 1x1 convolution's windows do not overlap: each input element is read by at most
// one column entry. Its col2im then writes x [Cg, H, W] row by row, the entries no window reads
// zero, instead of zeroing all of x and adding the columns back (two passes over x).
bool disjoint_one_by_one(const Geometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.p.padding_begin[0] == 0 && g.p.padding_begin[1] == 0;
}

template <typename T>
void col2im_disjoint(const Geometry& g, const T* col, T* x) {
  const int64_t sh = g.p.stride[0], sw = g.p.stride[1], out_w = g.out_w;
  const int64_t inside_w = std::min(out_w, (g.width - 1) / sw + 1);  // columns past W read end padding
  for (int64_t c = 0; c < g.group_channels(); ++c)
    for (int64_t ih = 0; ih < g.height; ++ih) {
      T* row = x + (c * g.height + ih) * g.width;
      if (ih % sh != 0 || ih / sh >= g.out_h) {
        std::fill(row, row + g.width, T(0));
        continue;
      }
      const T* s = col + c * g.out_area() + (ih / sh) * out_w;
      int64_t ow = 0;
      if constexpr (std::is_same_v<T, float>)
        if (sw == 2)  // eight columns and the zeros between them as two whole vectors
          for (; ow + 8 <= inside_w && 2 * ow + 16 <= g.width; ow += 8) {
            const cpu::vec8::f8 v = cpu::vec8::load8(s + ow), z{};
            cpu::vec8::store8(row + 2 * ow, __builtin_shufflevector(v, z, 0, 8, 1, 9, 2, 10, 3, 11));
            cpu::vec8::store8(row + 2 * ow + 8, __builtin_shufflevector(v, z, 4, 12, 5, 13, 6, 14, 7, 15));
          }
      std::fill(row + ow * sw, row + g.width, T(0));
      for (; ow < inside_w; ++ow) row[ow * sw] = s[ow];
    }
}

// Runs fn(first, last) over the batch: in parallel chunks when there are enough images to give
// every thread one, else as one range on this thread (the GEMM inside then uses the threads).
template <typename Fn>
void over_batch(int64_t batch, const Fn& fn) {
  if (batch >= get_num_threads()) parallel_for(0, batch, 1, fn);
  else fn(0, batch);
}

template <typename T>
void gemm_rm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
             T beta, T* c, int64_t ldc) {
  cpu::gemm<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void forward_typed(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const Conv2dParams& p) {
  const Geometry g = geometry_of(input, weight, out, p);
  const T* x = input.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  const T* b = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* y = out.data_ptr<T>();
  const int64_t og = g.group_out_channels(), kg = g.col_rows(), area = g.out_area();
  over_batch(g.batch, [&](int64_t n0, int64_t n1) {
    T* col = g.direct() ? nullptr : cpu::thread_scratch<T>(kColumnSlot, size_t(kg * area));
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* xg = x + (n * g.channels + grp * g.group_channels()) * g.in_area();
        T* yg = y + (n * g.out_channels + grp * og) * area;
        if (b)
          for (int64_t o = 0; o < og; ++o) std::fill(yg + o * area, yg + (o + 1) * area, b[grp * og + o]);
        if (!g.direct()) im2col(g, xg, col, area);
        gemm_rm<T>(false, false, og, area, kg, w + grp * og * kg, kg, g.direct() ? xg : col, area, b ? T(1) : T(0),
                   yg, area);
      }
  });
}

template <typename T>
void backward_input_typed(const Tensor& grad_input, const Tensor& grad_output, const Tensor& weight,
                          const Tensor& bias, const Conv2dParams& p) {
  const Geometry g = geometry_of(grad_input, weight, grad_output, p);
  const T* dy = grad_output.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  const T* b = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* dx = grad_input.data_ptr<T>();
  const int64_t og = g.group_out_channels(), kg = g.col_rows(), area = g.out_area();
  const int64_t cg = g.group_channels(), in_area = g.in_area();
  over_batch(g.batch, [&](int64_t n0, int64_t n1) {
    T* col = g.direct() ? nullptr : cpu::thread_scratch<T>(kColumnSlot, size_t(kg * area));
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* dyg = dy + (n * g.out_channels + grp * og) * area;
        T* dxg = dx + (n * g.channels + grp * cg) * in_area;
        if (g.direct()) {
          gemm_rm<T>(true, false, cg, area, og, w + grp * og * kg, kg, dyg, area, T(0), dxg, area);
        } else {
          gemm_rm<T>(true, false, kg, area, og, w + grp * og * kg, kg, dyg, area, T(0), col, area);
          if (disjoint_one_by_one(g)) {
            col2im_disjoint(g, col, dxg);
          } else {
            std::fill(dxg, dxg + cg * in_area, T(0));
            col2im(g, col, dxg, area);
          }
        }
        if (b)
          for (int64_t c = 0; c < cg; ++c)
            for (T* v = dxg + c * in_area; v != dxg + (c + 1) * in_area; ++v) *v += b[grp * cg + c];
      }
  });
}

template <typename T>
void backward_weight_typed(const Tensor& grad_weight, const Tensor& grad_output, const Tensor& input,
                           const Conv2dParams& p) {
  const Geometry g = geometry_of(input, grad_weight, grad_output, p);
  const T* dy = grad_output.data_ptr<T>();
  const T* x = input.data_ptr<T>();
  T* dw = grad_weight.data_ptr<T>();
  const int64_t og = g.group_out_channels(), kg = g.col_rows(), area = g.out_area();
  // Per-chunk partial sums added in a fixed order (convolution_weight_chunks.h).
  auto run_chunk = [&](int64_t n0, int64_t n1, T* acc) {
    T* col = g.direct() ? nullptr : cpu::thread_scratch<T>(kColumnSlot, size_t(kg * area));
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* xg = x + (n * g.channels + grp * g.group_channels()) * g.in_area();
        if (!g.direct()) im2col(g, xg, col, area);
        gemm_rm<T>(false, true, og, kg, area, dy + (n * g.out_channels + grp * og) * area, area,
                   g.direct() ? xg : col, area, T(1), acc + grp * og * kg, kg);
      }
  };
  cpu::sum_weight_gradient_over_chunks(g.batch, dw, grad_weight.numel(), kPartialsSlot, run_chunk);
}

// Runs kernel<T> for f32 and f64; bf16 and f16 operands are widened to f32 and the result
// (always the first tensor) rounded back once.
template <template <typename> class Kernel, typename... Rest>
void run_typed(const Tensor& result, const Tensor& a, const Tensor& b, const Tensor& bias, const Rest&... rest) {
  if (result.dtype() == DType::f32) return Kernel<float>::run(result, a, b, bias, rest...);
  if (result.dtype() == DType::f64) return Kernel<double>::run(result, a, b, bias, rest...);
  EMBER_CHECK(result.dtype() == DType::bf16 || result.dtype() == DType::f16,
              "conv2d CPU kernel: unsupported dtype ", result.dtype());
  auto wide = [](const Tensor& t) { return t.defined() ? native::to_dtype(t, DType::f32) : Tensor(); };
  Tensor result32 = make_tensor(result.shape(), DType::f32, result.device());
  Kernel<float>::run(result32, wide(a), wide(b), wide(bias), rest...);
  native::copy_(result, result32);
}

template <typename T>
struct Forward {
  static void run(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
    if constexpr (std::is_same_v<T, float>) {
      const cpu::ConvPath path = cpu::conv_path_for(cpu::ConvPass::Forward, x.shape(), w.shape(), out.shape(), p,
                                                    b.defined());
      if (path == cpu::ConvPath::OneDnn) return cpu::onednn_conv2d(out, x, w, b, p);
      if (path == cpu::ConvPath::Direct) return cpu::direct_conv2d(out, x, w, b, p);
      if (cpu::pointwise_conv_applies(x.shape(), w.shape(), out.shape(), p))
        return cpu::pointwise_conv2d(out, x, w, b, p);
    }
    forward_typed<T>(out, x, w, b, p);
  }
};
template <typename T>
struct BackwardInput {
  static void run(const Tensor& dx, const Tensor& dy, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
    if constexpr (std::is_same_v<T, float>) {
      if (cpu::conv_path_for(cpu::ConvPass::BackwardInput, dx.shape(), w.shape(), dy.shape(), p, b.defined()) ==
          cpu::ConvPath::OneDnn)
        return cpu::onednn_conv2d_backward_input(dx, dy, w, p);
      if (cpu::pointwise_input_grad_applies(dx.shape(), w.shape(), dy.shape(), p))
        return cpu::pointwise_conv2d_backward_input(dx, dy, w, b, p);
    }
    backward_input_typed<T>(dx, dy, w, b, p);
  }
};
template <typename T>
struct BackwardWeight {
  static void run(const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor&, const Conv2dParams& p) {
    if constexpr (std::is_same_v<T, float>) {
      const cpu::ConvPath path =
          cpu::conv_path_for(cpu::ConvPass::BackwardWeight, x.shape(), dw.shape(), dy.shape(), p, false);
      if (path == cpu::ConvPath::OneDnn) return cpu::onednn_conv2d_backward_weight(dw, dy, x, p);
      if (path == cpu::ConvPath::Direct) return cpu::direct_conv2d_backward_weight(dw, dy, x, p);
    }
    if constexpr (std::is_same_v<T, float>)
      if (cpu::pointwise_conv_applies(x.shape(), dw.shape(), dy.shape(), p))
        return cpu::pointwise_conv2d_backward_weight(dw, dy, x, p);
    backward_weight_typed<T>(dw, dy, x, p);
  }
};

void conv2d_cpu(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
  run_typed<Forward>(out, x, w, b, p);
}
void conv2d_backward_input_cpu(const Tensor& dx, const Tensor& dy, const Tensor& w, const Tensor& b,
                               const Conv2dParams& p) {
  run_typed<BackwardInput>(dx, dy, w, b, p);
}
void conv2d_backward_weight_cpu(const Tensor& dw, const Tensor& dy, const Tensor& x, const Conv2dParams& p) {
  run_typed<BackwardWeight>(dw, dy, x, Tensor(), p);
}

}  // namespace

EMBER_REGISTER_KERNEL(native::conv2d_stub, CPU, &conv2d_cpu);
EMBER_REGISTER_KERNEL(native::conv2d_backward_input_stub, CPU, &conv2d_backward_input_cpu);
EMBER_REGISTER_KERNEL(native::conv2d_backward_weight_stub, CPU, &conv2d_backward_weight_cpu);

}  // namespace ember
