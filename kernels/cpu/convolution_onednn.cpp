#include "kernels/cpu/convolution_onednn.h"

#include <dnnl.hpp>

#include <algorithm>
#include <array>
#include <utility>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/convolution_path.h"
#include "kernels/cpu/convolution_weight_chunks.h"
#include "kernels/cpu/onednn_runtime.h"
#include "kernels/cpu/scratch.h"

namespace ember::cpu {
namespace {

using native::Conv2dParams;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Distinct convolutions kept (a model has a few dozen).
constexpr size_t kCacheCapacity = 128;
// Scratch slots for the blocked copies (convolution.cpp's GEMM path uses the lower ones).
constexpr int kSourceSlot = 4;
constexpr int kSecondSlot = 5;
constexpr int kResultSlot = 6;
// The weight gradient's per-chunk partial sums (the caller's; its chunks use the slots above).
constexpr int kPartialsSlot = 7;

// The end padding oneDNN needs for the output size (negative when the stride skips input rows
// past the last window, which the primitive does not take).
int64_t end_padding(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation, int64_t begin) {
  return (out - 1) * stride + (kernel - 1) * dilation + 1 - in - begin;
}

}  // namespace

bool onednn_conv_supports(ConvPass pass, const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p,
                          bool has_bias) {
  if (p.groups != 1 || (pass == ConvPass::BackwardInput && has_bias)) return false;
  if (x[0] == 0 || x[1] == 0 || w[0] == 0) return false;
  const bool one_by_one = w[2] == 1 && w[3] == 1 && p.stride[0] == 1 && p.stride[1] == 1 &&
                          p.padding_begin[0] == 0 && p.padding_begin[1] == 0;
  if (one_by_one) return false;
  for (size_t i = 0; i < 2; ++i)
    if (end_padding(x[2 + i], y[2 + i], w[2 + i], p.stride[i], p.dilation[i], p.padding_begin[i]) < 0) return false;
  return true;
}

namespace {

// ---- primitives

struct ConvKey {
  int pass;
  std::array<int64_t, 9> sizes;     // N, C, H, W, O, kH, kW, Ho, Wo
  std::array<int64_t, 6> geometry;  // stride, dilation, padding_begin (h, w)
  bool bias;
  bool operator==(const ConvKey&) const = default;
};

struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    size_t h = std::hash<int>{}(k.pass * 2 + int(k.bias));
    auto mix = [&h](int64_t v) { h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : k.sizes) mix(v);
    for (int64_t v : k.geometry) mix(v);
    return h;
  }
};

// One pass's primitive and the reorders between Ember's plain layouts and the primitive's.
// Its operands by pass:   source   second   result
//   forward               x        w        y
//   backward input        dY       w        dx
//   backward weight       dY       x        dW
struct ConvPrimitive {
  dnnl::primitive conv;
  dnnl::memory::desc source, second, result, plain_source, plain_second, plain_result, bias;
  dnnl::reorder source_in, second_in, result_out;
  size_t scratchpad_bytes = 0;
};

ConvKey key_of(ConvPass pass, int64_t images, const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p,
               bool bias) {
  return {int(pass),
          {images, x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3]},
          {p.stride[0], p.stride[1], p.dilation[0], p.dilation[1], p.padding_begin[0], p.padding_begin[1]},
          bias};
}

ConvPrimitive create(const ConvKey& k) {
  const auto [n, c, h, w, o, kh, kw, ho, wo] = k.sizes;
  const auto [sh, sw, dh, dw, ph, pw] = k.geometry;
  OmpThreads one_thread(1);
  const dnnl::engine& engine = onednn_engine();
  const dnnl::memory::desc x_plain({n, c, h, w}, dt::f32, tag::nchw), y_plain({n, o, ho, wo}, dt::f32, tag::nchw);
  const dnnl::memory::desc w_plain({o, c, kh, kw}, dt::f32, tag::oihw);
  const dnnl::memory::desc x_any({n, c, h, w}, dt::f32, tag::any), y_any({n, o, ho, wo}, dt::f32, tag::any);
  const dnnl::memory::desc w_any({o, c, kh, kw}, dt::f32, tag::any), b_md({o}, dt::f32, tag::x);
  const dims strides = {sh, sw}, dilates = {dh - 1, dw - 1}, pad_l = {ph, pw};
  const dims pad_r = {end_padding(h, ho, kh, sh, dh, ph), end_padding(w, wo, kw, sw, dw, pw)};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const bool forward = k.pass == int(ConvPass::Forward);
  const auto fwd_desc = k.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                                 dnnl::algorithm::convolution_direct, x_any, w_any,
                                                                 b_md, y_any, strides, dilates, pad_l, pad_r)
                               : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                                 dnnl::algorithm::convolution_direct, x_any, w_any,
                                                                 y_any, strides, dilates, pad_l, pad_r);
  const dnnl::convolution_forward::primitive_desc fwd(fwd_desc, attr, engine);
  ConvPrimitive made;
  made.bias = b_md;
  // The primitive and its operands' layouts, as it chose them and as Ember holds them.
  using md = dnnl::memory::desc;
  auto adopt = [&made](dnnl::primitive conv, const md& scratchpad, const md& source, const md& plain_source,
                       const md& second, const md& plain_second, const md& result, const md& plain_result) {
    made.conv = std::move(conv), made.scratchpad_bytes = scratchpad.get_size();
    made.source = source, made.second = second, made.result = result;
    made.plain_source = plain_source, made.plain_second = plain_second, made.plain_result = plain_result;
  };
  if (forward) {
    adopt(dnnl::convolution_forward(fwd), fwd.scratchpad_desc(), fwd.src_desc(), x_plain, fwd.weights_desc(),
          w_plain, fwd.dst_desc(), y_plain);
  } else if (k.pass == int(ConvPass::BackwardInput)) {
    const dnnl::convolution_backward_data::primitive_desc bwd(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, x_any, w_any, y_any, strides,
                                              dilates, pad_l, pad_r),
        attr, engine, fwd);
    adopt(dnnl::convolution_backward_data(bwd), bwd.scratchpad_desc(), bwd.diff_dst_desc(), y_plain,
          bwd.weights_desc(), w_plain, bwd.diff_src_desc(), x_plain);
  } else {
    const dnnl::convolution_backward_weights::primitive_desc bwd(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, x_any, w_any, y_any, strides,
                                                 dilates, pad_l, pad_r),
        attr, engine, fwd);
    adopt(dnnl::convolution_backward_weights(bwd), bwd.scratchpad_desc(), bwd.diff_dst_desc(), y_plain,
          bwd.src_desc(), x_plain, bwd.diff_weights_desc(), w_plain);
  }
  made.source_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine, made.plain_source, engine, made.source));
  made.second_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine, made.plain_second, engine, made.second));
  made.result_out = dnnl::reorder(dnnl::reorder::primitive_desc(engine, made.result, engine, made.plain_result));
  return made;
}

using ConvCache = PrimitiveCache<ConvKey, ConvPrimitive, ConvKeyHash>;

ConvCache& cache() {
  static ConvCache* c = new ConvCache(kCacheCapacity);  // outlives pool threads at exit
  return *c;
}

// A memory in `md`: the caller's buffer when that is already the layout, else per-thread scratch.
dnnl::memory scratch_memory(const dnnl::memory::desc& md, int slot) {
  return dnnl::memory(md, onednn_engine(), thread_scratch_bytes(slot, md.get_size()));
}

// What the second operand's scratch slot holds on this thread within one call: the weight,
// reordered by an earlier chunk of images, in this layout (forward and input gradient).
struct ReorderedWeight {
  bool held = false;
  dnnl::memory::desc layout;
};

// Runs one pass on `images` images on the calling thread, the pointers at its first image (the
// weight, and the weight gradient written, whole): source and second (plain) in, result
// (plain) out. x, w and y give the shapes of the forward convolution. With `weight`, the second
// operand is the call's weight, reordered once for all its chunks.
void run_images(ConvPass pass, int64_t images, const Shape& x, const Shape& w, const Shape& y, const float* source,
                const float* second, const float* bias, float* result, const Conv2dParams& p,
                ReorderedWeight* weight = nullptr) {
  const ConvKey key = key_of(pass, images, x, w, y, p, bias != nullptr);
  const std::shared_ptr<const ConvPrimitive> prim = cache().get(key, create);
  const dnnl::engine& engine = onednn_engine();
  dnnl::stream& stream = onednn_thread_stream();
  OmpThreads one_thread(1);
  dnnl::memory plain_source(prim->plain_source, engine, const_cast<float*>(source));
  dnnl::memory plain_second(prim->plain_second, engine, const_cast<float*>(second));
  dnnl::memory plain_result(prim->plain_result, engine, result);
  const bool same_source = prim->source == prim->plain_source, same_second = prim->second == prim->plain_second;
  const bool same_result = prim->result == prim->plain_result;
  dnnl::memory src = same_source ? plain_source : scratch_memory(prim->source, kSourceSlot);
  dnnl::memory sec = same_second ? plain_second : scratch_memory(prim->second, kSecondSlot);
  dnnl::memory res = same_result ? plain_result : scratch_memory(prim->result, kResultSlot);
  if (!same_source) prim->source_in.execute(stream, plain_source, src);
  if (!same_second && !(weight && weight->held && weight->layout == prim->second)) {
    prim->second_in.execute(stream, plain_second, sec);
    if (weight) *weight = {true, prim->second};
  }
  std::unordered_map<int, dnnl::memory> args;
  if (pass == ConvPass::Forward) {
    args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, sec}, {DNNL_ARG_DST, res}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(prim->bias, engine, const_cast<float*>(bias)));
  } else if (pass == ConvPass::BackwardInput) {
    args = {{DNNL_ARG_DIFF_DST, src}, {DNNL_ARG_WEIGHTS, sec}, {DNNL_ARG_DIFF_SRC, res}};
  } else {
    args = {{DNNL_ARG_DIFF_DST, src}, {DNNL_ARG_SRC, sec}, {DNNL_ARG_DIFF_WEIGHTS, res}};
  }
  if (prim->scratchpad_bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(dnnl::memory::desc({dnnl::memory::dim(prim->scratchpad_bytes)},
                                                                        dt::u8, tag::x),
                                                   engine, onednn_thread_scratchpad(prim->scratchpad_bytes)));
  prim->conv.execute(stream, args);
  if (!same_result) prim->result_out.execute(stream, res, plain_result);
  stream.wait();
}

// Images per primitive call: about kChunkBytes of source and result, so the blocked copies the
// reorders write and read stay in cache around the convolution instead of going out to memory
// and back (fmnist 32->64 3x3, 128 images, one thread, best CPU time per call: forward 80 -> 81
// GFLOP/s, input gradient 84 -> 90 against the whole batch in one call; 256 KiB chunks gained
// less, 4 MiB ones nothing; the weight gradient, unchanged by chunks, keeps one call per thread).
constexpr int64_t kChunkBytes = 1 << 20;

int64_t chunk_images(int64_t source_image, int64_t result_image) {
  return std::max<int64_t>(1, kChunkBytes / (int64_t(sizeof(float)) * (source_image + result_image)));
}

// Forward and input gradient: the batch split over Ember's pool, each thread running the
// primitive (one OpenMP thread) on its own images, a chunk at a time, the weight reordered once:
// oneDNN's OpenMP threads spin after each call and starve Ember's pool threads of the cores they
// share.
void run_per_image(ConvPass pass, const Shape& x, const Shape& y, const Tensor& weight, const float* source,
                   const float* bias, float* result, const Conv2dParams& p) {
  const bool forward = pass == ConvPass::Forward;
  const int64_t x_image = x[1] * x[2] * x[3], y_image = y[1] * y[2] * y[3];
  const int64_t source_image = forward ? x_image : y_image, result_image = forward ? y_image : x_image;
  const int64_t chunk = chunk_images(source_image, result_image);
  parallel_for(0, x[0], 1, [&](int64_t n0, int64_t n1) {
    ReorderedWeight reordered;
    for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
      const int64_t c1 = std::min(n1, c0 + chunk);
      run_images(pass, c1 - c0, x, weight.shape(), y, source + c0 * source_image, weight.data_ptr<float>(), bias,
                 result + c0 * result_image, p, &reordered);
    }
  });
}

}  // namespace

void onednn_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const Conv2dParams& params) {
  run_per_image(ConvPass::Forward, input.shape(), out.shape(), weight, input.data_ptr<float>(),
                bias.defined() ? bias.data_ptr<float>() : nullptr, out.data_ptr<float>(), params);
}

void onednn_conv2d_backward_input(const Tensor& grad_input, const Tensor& grad_output, const Tensor& weight,
                                  const Conv2dParams& params) {
  run_per_image(ConvPass::BackwardInput, grad_input.shape(), grad_output.shape(), weight,
                grad_output.data_ptr<float>(), nullptr, grad_input.data_ptr<float>(), params);
}

// The batch in one chunk of images per thread (convolution_weight_chunks.h), the primitive
// summing each chunk's images.
void onednn_conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_output, const Tensor& input,
                                   const Conv2dParams& params) {
  const Shape &x = input.shape(), &y = grad_output.shape(), &w = grad_weight.shape();
  const int64_t x_image = x[1] * x[2] * x[3], y_image = y[1] * y[2] * y[3];
  sum_weight_gradient_over_chunks(x[0], grad_weight.data_ptr<float>(), grad_weight.numel(), kPartialsSlot,
                                  [&](int64_t n0, int64_t n1, float* acc) {
                                    run_images(ConvPass::BackwardWeight, n1 - n0, x, w, y,
                                               grad_output.data_ptr<float>() + n0 * y_image,
                                               input.data_ptr<float>() + n0 * x_image, nullptr, acc, params);
                                  });
}

}  // namespace ember::cpu
