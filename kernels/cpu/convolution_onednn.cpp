#include "kernels/cpu/convolution_onednn.h"

#include <dnnl.hpp>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/convolution_path.h"
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
constexpr int kWeightSlot = 5;
constexpr int kResultSlot = 6;

// ---- path selection

ConvPath parse_path(const std::string& v) {
  if (v == "gemm") return ConvPath::Gemm;
  if (v == "onednn") return ConvPath::OneDnn;
  EMBER_FAIL("EMBER_CONV_PATH: expected gemm or onednn, got '", v, "'");
}

constexpr int kAutomatic = -1;

std::atomic<int>& forced_path() {
  static std::atomic<int> forced{[] {
    const char* env = std::getenv("EMBER_CONV_PATH");
    return env == nullptr || *env == '\0' ? kAutomatic : static_cast<int>(parse_path(env));
  }()};
  return forced;
}

// The end padding oneDNN needs for the output size (negative when the stride skips input rows
// past the last window, which the primitive does not take).
int64_t end_padding(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation, int64_t begin) {
  return (out - 1) * stride + (kernel - 1) * dilation + 1 - in - begin;
}

bool onednn_supports(ConvPass pass, const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p,
                     bool has_bias) {
  if (pass == ConvPass::BackwardWeight || p.groups != 1 || (pass == ConvPass::BackwardInput && has_bias)) return false;
  if (x[0] == 0 || x[1] == 0 || w[0] == 0) return false;
  const bool one_by_one = w[2] == 1 && w[3] == 1 && p.stride[0] == 1 && p.stride[1] == 1 &&
                          p.padding_begin[0] == 0 && p.padding_begin[1] == 0;
  if (one_by_one) return false;
  for (size_t i = 0; i < 2; ++i)
    if (end_padding(x[2 + i], y[2 + i], w[2 + i], p.stride[i], p.dilation[i], p.padding_begin[i]) < 0) return false;
  return true;
}

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
// `source` is the activation read (x forward, dY backward), `result` the one written.
struct ConvPrimitive {
  dnnl::primitive conv;
  dnnl::memory::desc source, weight, result, plain_source, plain_weight, plain_result, bias;
  dnnl::reorder source_in, weight_in, result_out;
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
  if (forward) {
    made.conv = dnnl::convolution_forward(fwd);
    made.source = fwd.src_desc(), made.weight = fwd.weights_desc(), made.result = fwd.dst_desc();
    made.plain_source = x_plain, made.plain_result = y_plain;
    made.scratchpad_bytes = fwd.scratchpad_desc().get_size();
  } else {
    const dnnl::convolution_backward_data::primitive_desc bwd(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, x_any, w_any, y_any, strides,
                                              dilates, pad_l, pad_r),
        attr, engine, fwd);
    made.conv = dnnl::convolution_backward_data(bwd);
    made.source = bwd.diff_dst_desc(), made.weight = bwd.weights_desc(), made.result = bwd.diff_src_desc();
    made.plain_source = y_plain, made.plain_result = x_plain;
    made.scratchpad_bytes = bwd.scratchpad_desc().get_size();
  }
  made.plain_weight = w_plain;
  made.source_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine, made.plain_source, engine, made.source));
  made.weight_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine, made.plain_weight, engine, made.weight));
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

// Runs one pass on images [n0, n1) on the calling thread: source and weight (plain) in,
// result (plain) out. x and y give the shapes of the forward convolution.
void run_images(ConvPass pass, int64_t n0, int64_t n1, const Shape& x, const Shape& y, const Tensor& weight,
                const float* source, const float* bias, float* result, const Conv2dParams& p) {
  const ConvKey key = key_of(pass, n1 - n0, x, weight.shape(), y, p, bias != nullptr);
  const std::shared_ptr<const ConvPrimitive> prim = cache().get(key, create);
  const bool forward = pass == ConvPass::Forward;
  const int64_t x_image = x[1] * x[2] * x[3], y_image = y[1] * y[2] * y[3];
  source += n0 * (forward ? x_image : y_image);
  result += n0 * (forward ? y_image : x_image);
  const dnnl::engine& engine = onednn_engine();
  dnnl::stream& stream = onednn_thread_stream();
  OmpThreads one_thread(1);
  dnnl::memory plain_source(prim->plain_source, engine, const_cast<float*>(source));
  dnnl::memory plain_weight(prim->plain_weight, engine, const_cast<float*>(weight.data_ptr<float>()));
  dnnl::memory plain_result(prim->plain_result, engine, result);
  const bool same_source = prim->source == prim->plain_source, same_weight = prim->weight == prim->plain_weight;
  const bool same_result = prim->result == prim->plain_result;
  dnnl::memory src = same_source ? plain_source : scratch_memory(prim->source, kSourceSlot);
  dnnl::memory wei = same_weight ? plain_weight : scratch_memory(prim->weight, kWeightSlot);
  dnnl::memory res = same_result ? plain_result : scratch_memory(prim->result, kResultSlot);
  if (!same_source) prim->source_in.execute(stream, plain_source, src);
  if (!same_weight) prim->weight_in.execute(stream, plain_weight, wei);
  std::unordered_map<int, dnnl::memory> args;
  if (forward) {
    args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, res}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(prim->bias, engine, const_cast<float*>(bias)));
  } else {
    args = {{DNNL_ARG_DIFF_DST, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, res}};
  }
  if (prim->scratchpad_bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(dnnl::memory::desc({dnnl::memory::dim(prim->scratchpad_bytes)},
                                                                        dt::u8, tag::x),
                                                   engine, onednn_thread_scratchpad(prim->scratchpad_bytes)));
  prim->conv.execute(stream, args);
  if (!same_result) prim->result_out.execute(stream, res, plain_result);
  stream.wait();
}

// The batch split over Ember's pool, each thread running the primitive (one OpenMP thread) on
// its own images: oneDNN's OpenMP threads spin after each call and starve Ember's pool threads
// of the cores they share.
void run(ConvPass pass, const Shape& x, const Shape& y, const Tensor& weight, const float* source, const float* bias,
         float* result, const Conv2dParams& p) {
  parallel_for(0, x[0], 1, [&](int64_t n0, int64_t n1) {
    run_images(pass, n0, n1, x, y, weight, source, bias, result, p);
  });
}

}  // namespace

const char* conv_path_name(ConvPath path) { return path == ConvPath::OneDnn ? "onednn" : "gemm"; }

void set_conv_path(std::optional<ConvPath> path) {
  forced_path().store(path ? static_cast<int>(*path) : kAutomatic, std::memory_order_relaxed);
}

ConvPath conv_path_for(ConvPass pass, const Shape& x, const Shape& weight, const Shape& y, const Conv2dParams& params,
                       bool has_bias) {
  const int forced = forced_path().load(std::memory_order_relaxed);
  if (!onednn_supports(pass, x, weight, y, params, has_bias)) return ConvPath::Gemm;
  if (forced != kAutomatic) return static_cast<ConvPath>(forced);
  // A batch smaller than the pool would leave threads idle (the batch is what is split); a 1x1
  // kernel does too little work per element for the reorders to pay.
  const bool wins = weight[1] >= kOneDnnMinChannels && weight[2] * weight[3] > 1 && x[0] >= get_num_threads();
  return wins ? ConvPath::OneDnn : ConvPath::Gemm;
}

void onednn_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const Conv2dParams& params) {
  run(ConvPass::Forward, input.shape(), out.shape(), weight, input.data_ptr<float>(),
      bias.defined() ? bias.data_ptr<float>() : nullptr, out.data_ptr<float>(), params);
}

void onednn_conv2d_backward_input(const Tensor& grad_input, const Tensor& grad_output, const Tensor& weight,
                                  const Conv2dParams& params) {
  run(ConvPass::BackwardInput, grad_input.shape(), grad_output.shape(), weight, grad_output.data_ptr<float>(), nullptr,
      grad_input.data_ptr<float>(), params);
}

}  // namespace ember::cpu
