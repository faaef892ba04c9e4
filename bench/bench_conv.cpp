// Ember's CPU convolution kernels (im2col + Ember's GEMM) against oneDNN's convolution
// primitive called directly, shape by shape, in one binary. f32, NCHW.
//
//   ember/<pass>/<shape>/<threads>    native::conv2d, conv2d_backward_input or
//                                     conv2d_backward_weight (the kernels behind conv1d, conv2d,
//                                     conv_transpose2d and their gradients); outputs allocated
//                                     per call, as the ops do
//   onednn/<pass>/<shape>/<threads>   dnnl::convolution_forward / _backward_data /
//                                     _backward_weights with NCHW activations (Ember's layout)
//                                     and the weight in the layout oneDNN prefers, reordered
//                                     once outside the timed loop; OpenMP set to the thread count.
//                                     The label names oneDNN's implementation (with NCHW
//                                     activations oneDNN 2.6 picks its own im2col + sgemm,
//                                     "gemm:jit").
//   onednn_blocked/<pass>/...         the same with every tensor in the layout oneDNN prefers
//                                     (blocked nChw8c/nChw16c: its direct JIT kernels), tensors
//                                     created in that layout, no reorders timed: what oneDNN
//                                     reaches when a framework keeps its own layout throughout.
//   onednn_reordered/<pass>/...       the blocked kernels on NCHW tensors: each call reorders its
//                                     inputs (activations and weight) into the blocked layouts
//                                     and its output back, all timed: what a oneDNN path inside
//                                     Ember's conv2d on NCHW tensors would cost end to end.
//
// pass: fwd (y = conv(x, w)), bwd_data (dx), bwd_weight (dw). "GFLOP/s" counts
// 2 * N * O * Ho * Wo * (C / groups) * kH * kW per pass (the same for all three).
// Shapes: LeNet (N=64), a small Fashion-MNIST CNN (N=128), ResNet-18 layers (N=8).
#include <benchmark/benchmark.h>
#include <dnnl.hpp>
#include <omp.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "bench/progress_reporter.h"
#include "core/native/convolution.h"
#include "ember/ember.h"

namespace {

struct ConvShape {
  const char* name;
  int64_t n, c, h, w, o, k, stride, pad;
};

const ConvShape kShapes[] = {
    {"lenet_c1_1x28x28_6_5x5", 64, 1, 28, 28, 6, 5, 1, 0},
    {"lenet_c2_6x12x12_16_5x5", 64, 6, 12, 12, 16, 5, 1, 0},
    {"fmnist_c1_1x28x28_32_3x3", 128, 1, 28, 28, 32, 3, 1, 1},
    {"fmnist_c2_32x14x14_64_3x3", 128, 32, 14, 14, 64, 3, 1, 1},
    {"resnet_64x56x56_64_3x3", 8, 64, 56, 56, 64, 3, 1, 1},
    {"resnet_64x56x56_128_3x3_s2", 8, 64, 56, 56, 128, 3, 2, 1},
    {"resnet_128x28x28_128_3x3", 8, 128, 28, 28, 128, 3, 1, 1},
    {"resnet_64x56x56_128_1x1_s2", 8, 64, 56, 56, 128, 1, 2, 0},
    {"resnet_256x14x14_256_3x3", 8, 256, 14, 14, 256, 3, 1, 1},
};

enum class Pass { Forward, BackwardData, BackwardWeight };
const char* pass_name(Pass p) {
  return p == Pass::Forward ? "fwd" : p == Pass::BackwardData ? "bwd_data" : "bwd_weight";
}

int64_t out_size(const ConvShape& s, int64_t size) { return (size + 2 * s.pad - s.k) / s.stride + 1; }

void count_flops(benchmark::State& state, const ConvShape& s) {
  const double flops = 2.0 * double(s.n * s.o * out_size(s, s.h) * out_size(s, s.w)) * double(s.c * s.k * s.k);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void ember_conv(benchmark::State& state, ConvShape s, Pass pass, int threads) {
  using namespace ember;
  set_num_threads(threads);
  const native::Conv2dParams p{{s.stride, s.stride}, {s.pad, s.pad}, {s.pad, s.pad}, {1, 1}, 1};
  const Tensor x = randn({s.n, s.c, s.h, s.w}), w = randn({s.o, s.c, s.k, s.k});
  const Tensor dy = randn({s.n, s.o, out_size(s, s.h), out_size(s, s.w)});
  for (auto _ : state) {
    Tensor r = pass == Pass::Forward      ? native::conv2d(x, w, Tensor(), p)
               : pass == Pass::BackwardData ? native::conv2d_backward_input(dy, w, Tensor(), x.shape(), p)
                                            : native::conv2d_backward_weight(dy, x, w.shape(), p);
    benchmark::DoNotOptimize(r.raw_data());
  }
  count_flops(state, s);
}

enum class Layout { Nchw, Blocked, BlockedReordered };
const char* layout_prefix(Layout l) {
  return l == Layout::Nchw ? "onednn" : l == Layout::Blocked ? "onednn_blocked" : "onednn_reordered";
}

void onednn_conv(benchmark::State& state, ConvShape s, Pass pass, int threads, Layout layout) {
  const bool blocked = layout != Layout::Nchw;
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  omp_set_num_threads(threads);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const int64_t ho = out_size(s, s.h), wo = out_size(s, s.w);
  const tag activations = blocked ? tag::any : tag::nchw;
  const dnnl::memory::desc src_md({s.n, s.c, s.h, s.w}, dt::f32, activations);
  const dnnl::memory::desc dst_md({s.n, s.o, ho, wo}, dt::f32, activations);
  const dnnl::memory::desc plain_w_md({s.o, s.c, s.k, s.k}, dt::f32, tag::oihw);
  const dnnl::memory::desc any_w_md({s.o, s.c, s.k, s.k}, dt::f32, tag::any);
  const dnnl::memory::dims strides = {s.stride, s.stride}, pads = {s.pad, s.pad};
  const dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_md,
                                      any_w_md, dst_md, strides, pads, pads),
      engine);
  auto filled = [&](const dnnl::memory::desc& md) {
    dnnl::memory m(md, engine);
    float* d = static_cast<float*>(m.get_data_handle());
    for (size_t i = 0; i < md.get_size() / sizeof(float); ++i) d[i] = float(i % 7) * 0.25f - 0.75f;
    return m;
  };
  // Activations in the layout the forward primitive chose (NCHW unless blocked).
  dnnl::memory src = filled(fwd_pd.src_desc()), dst = filled(fwd_pd.dst_desc()), plain_w = filled(plain_w_md);

  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  std::string impl;
  // The weight in the primitive's preferred layout, reordered once.
  auto weight_for = [&](const dnnl::memory::desc& md) {
    if (md == plain_w_md) return plain_w;
    dnnl::memory m(md, engine);
    dnnl::reorder(plain_w, m).execute(stream, plain_w, m);
    return m;
  };
  if (pass == Pass::Forward) {
    prim = dnnl::convolution_forward(fwd_pd);
    args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weight_for(fwd_pd.weights_desc())}, {DNNL_ARG_DST, dst}};
    impl = fwd_pd.impl_info_str();
  } else if (pass == Pass::BackwardData) {
    const dnnl::convolution_backward_data::primitive_desc pd(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_md, any_w_md, dst_md, strides,
                                              pads, pads),
        engine, fwd_pd);
    prim = dnnl::convolution_backward_data(pd);
    args = {{DNNL_ARG_DIFF_DST, filled(pd.diff_dst_desc())},
            {DNNL_ARG_WEIGHTS, weight_for(pd.weights_desc())},
            {DNNL_ARG_DIFF_SRC, filled(pd.diff_src_desc())}};
    impl = pd.impl_info_str();
  } else {
    const dnnl::convolution_backward_weights::primitive_desc pd(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_md, any_w_md, dst_md,
                                                 strides, pads, pads),
        engine, fwd_pd);
    prim = dnnl::convolution_backward_weights(pd);
    args = {{DNNL_ARG_SRC, filled(pd.src_desc())},
            {DNNL_ARG_DIFF_DST, filled(pd.diff_dst_desc())},
            {DNNL_ARG_DIFF_WEIGHTS, dnnl::memory(pd.diff_weights_desc(), engine)}};
    impl = pd.impl_info_str();
  }
  state.SetLabel(impl);
  // Reordered: every argument not already plain gets a plain twin, reordered in (inputs) or out
  // (the output) around each call.
  std::vector<std::pair<dnnl::reorder, std::pair<dnnl::memory, dnnl::memory>>> before, after;
  if (layout == Layout::BlockedReordered) {
    const int output_arg = pass == Pass::Forward        ? DNNL_ARG_DST
                           : pass == Pass::BackwardData ? DNNL_ARG_DIFF_SRC
                                                        : DNNL_ARG_DIFF_WEIGHTS;
    for (auto& [arg, mem] : args) {
      const dnnl::memory::desc md = mem.get_desc();
      const dnnl::memory::desc plain(md.dims(), dt::f32, md.dims().size() == 4 ? tag::nchw : tag::x);
      if (md == plain) continue;
      dnnl::memory user = filled(plain);
      if (arg == output_arg) after.push_back({dnnl::reorder(mem, user), {mem, user}});
      else before.push_back({dnnl::reorder(user, mem), {user, mem}});
    }
  }
  for (auto _ : state) {
    for (auto& [r, m] : before) r.execute(stream, m.first, m.second);
    prim.execute(stream, args);
    for (auto& [r, m] : after) r.execute(stream, m.first, m.second);
    stream.wait();
  }
  count_flops(state, s);
}

void register_all() {
  for (const ConvShape& s : kShapes)
    for (Pass pass : {Pass::Forward, Pass::BackwardData, Pass::BackwardWeight})
      for (int threads : {1, 2}) {
        const std::string suffix = std::string("/") + pass_name(pass) + "/" + s.name + "/" + std::to_string(threads);
        benchmark::RegisterBenchmark(("ember" + suffix).c_str(), ember_conv, s, pass, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
        for (Layout layout : {Layout::Nchw, Layout::Blocked, Layout::BlockedReordered})
          benchmark::RegisterBenchmark((layout_prefix(layout) + suffix).c_str(), onednn_conv, s, pass, threads,
                                       layout)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
      }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  bench::ProgressReporter reporter("bench_conv");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
