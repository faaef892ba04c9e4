// Ember's f32 and bf16 matmul against Eigen's f32 GEMM called directly, and Ember's packed GEMM against
// oneDNN's sgemm called directly, in one binary, at 1 and 2 threads.
// Shapes are M x K x N: [M, K] @ [K, N]. "GFLOP/s" counts 2*M*K*N floating-point operations per
// product. Times are wall-clock.
//
//   ember_matmul            ember::matmul(a [M,K], b [K,N]); output allocated per call
//   eigen_gemm              C.noalias() = A * B on preallocated row-major Eigen matrices
//   ember_matmul_bT         ember::matmul(a, w.t()) with w [N,K]: the linear-layer layout, w
//                           read in place as a column-major matrix
//   eigen_gemm_bT           C.noalias() = A * W.transpose()
//   ember_matmul_bf16       ember_matmul with bf16 a and b (f32 accumulation, bf16 output)
//   ember_matmul_bT_bf16    ember_matmul_bT with bf16 a and w
//
// The bf16 rows run at 1024x1024x1024 and 2048x256x768 (a BERT-base linear layer's shape).
//
//   bf16_<path>/<shape>     a bf16 product forced onto one bf16 GEMM path (kernels/cpu/gemm_bf16.h):
//                           onednn (label names oneDNN's ISA: avx512_core_amx, or
//                           avx512_core_bf16 when run with DNNL_MAX_CPU_ISA=AVX512_CORE_BF16),
//                           avx512bf16 (Ember's vdpbf16ps kernel), widened (f32 GEMM), amx
//                           (Ember's AMX tile kernel; skipped without AMX, never chosen
//                           automatically until these rows are measured). Shapes
//                           from a small BERT (hidden 256, FFN 1024, 2048 tokens, 64 x 128 attention):
//                             fc1      2048x256x1024   x @ W^T
//                             fc2      2048x1024x256   x @ W^T
//                             dW       256x2048x1024   dY^T @ X
//                             attn     64 x 128x128x64 bmm
//                             square   1024x1024x1024
//                           Paths alternate within each shape. Measured numbers and the dispatch
//                           they led to: the header of kernels/cpu/gemm_bf16.cpp.
//
//   packed/<layout>/<impl>/<shape>/<threads>
//                           Ember's packed GEMM (kernels/cpu/gemm_packed.h) against oneDNN's sgemm
//                           called directly, at the BERT training shapes of bench/bert_gemm_shapes.h
//                           (fwd X W^T, dgrad dY W, wgrad dY^T X; attention's batched per-head
//                           products). bench_gemm_libs times the same list with MKL and a current
//                           oneDNN (bench/compare_gemm_libs.sh runs both).
//                           impl: packed_f32 (f32 in, f32 out), onednn_f32 (dnnl_sgemm with
//                           OpenMP set to the thread count; like cpu::gemm at 1 thread; one call
//                           per head when batched), onednn_bands_f32 (cpu::gemm<float> forced onto
//                           oneDNN, one band per thread of Ember's pool, 2 threads only),
//                           packed_bf16 (bf16 in, bf16 out; cpu::gemm's bf16 path on CPUs without
//                           AMX or fast AVX512-BF16); batched: ember_bmm_f32 and ember_bmm_bf16
//                           (ember::bmm, Ember's run-time path).
//                           Operands and C are allocated once per case (per call for ember_bmm),
//                           beta = 0; CPU time is the whole process's. Measured numbers: the header
//                           of kernels/cpu/gemm_packed.cpp.
//   attention/<impl>/16x128x4x64/<threads>
//                           bert-mini's self-attention as training runs it: packed_self_attention
//                           on the fused QKV projection ([16, 128, 768], 4 heads of 64, a padding
//                           mask, dropout 0.1), forward then backward. GFLOP/s counts its seven
//                           per-head products (Q K^T and P V forward; backward recomputes Q K^T,
//                           then dO V^T, P^T dO, dS K, dS^T Q), the softmax and dropout around them
//                           in the time. impl: auto (cpu::gemm's run-time path for every product),
//                           onednn_f32 (every product forced onto oneDNN's sgemm), auto_bf16.
//   The FMA peak these rows are fractions of: build/bench/machine_limits.
//
// Ember runs Eigen's single-threaded GEMM on bands of C spread over its own thread pool;
// eigen_* use Eigen's own OpenMP threading (Eigen::setNbThreads), the usual way to run it.
// Benchmarks are registered shape by shape, Ember next to Eigen, so both see the same machine.
#include <benchmark/benchmark.h>
#include <dnnl.h>
#include <omp.h>

#include <Eigen/Core>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "bench/bert_gemm_shapes.h"
#include "bench/progress_reporter.h"
#include "ember/ember.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_f32_path.h"
#include "kernels/cpu/gemm_packed.h"

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Problem {
  int64_t m, k, n;
  int threads;
};

void prepare(benchmark::State& state, const Problem& p) {
  ember::set_num_threads(p.threads);
  Eigen::setNbThreads(p.threads);
  std::string label = "MxKxN=";
  label += std::to_string(p.m) + "x" + std::to_string(p.k) + "x" + std::to_string(p.n);
  label += " threads=" + std::to_string(p.threads);
  state.SetLabel(label);
}

void count_flops(benchmark::State& state, const Problem& p) {
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(p.m) * double(p.k) * double(p.n) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

RowMatrix eigen_copy(const ember::Tensor& t) {
  const ember::Tensor c = t.contiguous();
  return Eigen::Map<const RowMatrix>(c.data_ptr<float>(), c.size(0), c.size(1));
}

void ember_matmul(benchmark::State& state, Problem p) {
  prepare(state, p);
  const ember::Tensor a = ember::randn({p.m, p.k}), b = ember::randn({p.k, p.n});
  for (auto _ : state) {
    ember::Tensor c = ember::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  count_flops(state, p);
}

void ember_matmul_bT(benchmark::State& state, Problem p) {
  prepare(state, p);
  const ember::Tensor a = ember::randn({p.m, p.k}), w = ember::randn({p.n, p.k});
  for (auto _ : state) {
    ember::Tensor c = ember::matmul(a, w.t());
    benchmark::DoNotOptimize(c.raw_data());
  }
  count_flops(state, p);
}

void ember_matmul_bf16(benchmark::State& state, Problem p) {
  prepare(state, p);
  const ember::Tensor a = ember::randn({p.m, p.k}).to(ember::DType::bf16);
  const ember::Tensor b = ember::randn({p.k, p.n}).to(ember::DType::bf16);
  for (auto _ : state) {
    ember::Tensor c = ember::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  count_flops(state, p);
}

void ember_matmul_bT_bf16(benchmark::State& state, Problem p) {
  prepare(state, p);
  const ember::Tensor a = ember::randn({p.m, p.k}).to(ember::DType::bf16);
  const ember::Tensor w = ember::randn({p.n, p.k}).to(ember::DType::bf16);
  for (auto _ : state) {
    ember::Tensor c = ember::matmul(a, w.t());
    benchmark::DoNotOptimize(c.raw_data());
  }
  count_flops(state, p);
}

struct Bf16Problem {
  int64_t batch, m, k, n;
  bool trans_a, trans_b;
  int threads;
  ember::cpu::Bf16GemmPath path;
};

// An operand of logical shape [rows, cols] (batched when batch > 1), stored transposed when asked.
ember::Tensor bf16_operand(int64_t batch, int64_t rows, int64_t cols, bool transposed) {
  const ember::Shape stored = transposed ? ember::Shape{cols, rows} : ember::Shape{rows, cols};
  ember::Shape shape = stored;
  if (batch > 1) shape.insert(shape.begin(), batch);
  const ember::Tensor t = ember::randn(shape).to(ember::DType::bf16);
  return transposed ? t.transpose(-1, -2) : t;
}

void ember_bf16_path(benchmark::State& state, Bf16Problem p) {
  using namespace ember;
  if (!cpu::bf16_gemm_path_available(p.path)) {
    state.SkipWithError("this CPU cannot run the path");
    return;
  }
  set_num_threads(p.threads);
  cpu::set_bf16_gemm_path(p.path);
  std::string label = cpu::bf16_gemm_path_name(p.path);
  if (p.path == cpu::Bf16GemmPath::OneDnn) {
    label += '(';
    label += cpu::onednn_cpu_isa_name();
    label += ')';
  }
  label += " MxKxN=" + std::to_string(p.m) + "x" + std::to_string(p.k) + "x" + std::to_string(p.n);
  if (p.batch > 1) label += " batch=" + std::to_string(p.batch);
  label += " threads=" + std::to_string(p.threads);
  state.SetLabel(label);
  const Tensor a = bf16_operand(p.batch, p.m, p.k, p.trans_a), b = bf16_operand(p.batch, p.k, p.n, p.trans_b);
  for (auto _ : state) {
    Tensor c = p.batch > 1 ? bmm(a, b) : matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  cpu::set_bf16_gemm_path(std::nullopt);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(p.batch) * double(p.m) * double(p.k) * double(p.n) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void eigen_gemm(benchmark::State& state, Problem p) {
  prepare(state, p);
  const RowMatrix a = eigen_copy(ember::randn({p.m, p.k})), b = eigen_copy(ember::randn({p.k, p.n}));
  RowMatrix c(p.m, p.n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  count_flops(state, p);
}

void eigen_gemm_bT(benchmark::State& state, Problem p) {
  prepare(state, p);
  const RowMatrix a = eigen_copy(ember::randn({p.m, p.k})), w = eigen_copy(ember::randn({p.n, p.k}));
  RowMatrix c(p.m, p.n);
  for (auto _ : state) {
    c.noalias() = a * w.transpose();
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  count_flops(state, p);
}

void register_bf16_paths() {
  using ember::cpu::Bf16GemmPath;
  struct Shape {
    const char* name;
    int64_t batch, m, k, n;
    bool trans_a, trans_b;
  };
  const Shape shapes[] = {{"fc1", 1, 2048, 256, 1024, false, true},
                          {"fc2", 1, 2048, 1024, 256, false, true},
                          {"dW", 1, 256, 2048, 1024, true, false},
                          {"attn", 64, 128, 128, 64, false, false},
                          {"square", 1, 1024, 1024, 1024, false, false}};
  for (int threads : {1, 2})
    for (const Shape& s : shapes)
      for (Bf16GemmPath path :
           {Bf16GemmPath::OneDnn, Bf16GemmPath::Avx512Bf16, Bf16GemmPath::Widened, Bf16GemmPath::Amx}) {
        const Bf16Problem p{s.batch, s.m, s.k, s.n, s.trans_a, s.trans_b, threads, path};
        std::string name = std::string("bf16_") + ember::cpu::bf16_gemm_path_name(path) + "/" + s.name;
        name += threads == 1 ? "/1thread" : "/2threads";
        benchmark::RegisterBenchmark(name.c_str(), ember_bf16_path, p)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
}

// ---- packed GEMM against oneDNN's sgemm

enum class PackedImpl { PackedF32, OneDnnF32, OneDnnBandsF32, PackedBf16, BmmF32, BmmBf16 };

const char* impl_name(PackedImpl impl) {
  switch (impl) {
    case PackedImpl::PackedF32: return "packed_f32";
    case PackedImpl::OneDnnF32: return "onednn_f32";
    case PackedImpl::OneDnnBandsF32: return "onednn_bands_f32";
    case PackedImpl::PackedBf16: return "packed_bf16";
    case PackedImpl::BmmF32: return "ember_bmm_f32";
    case PackedImpl::BmmBf16: return "ember_bmm_bf16";
  }
  return "?";
}

template <class T>
std::vector<T> random_buffer(int64_t count) {
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<T> v(static_cast<size_t>(count));
  for (auto& x : v) x = T(dist(gen));
  return v;
}

void set_packed_label(benchmark::State& state, const bench::BertGemm& p, PackedImpl impl) {
  std::string label = impl_name(impl);
  if (impl == PackedImpl::PackedF32 || impl == PackedImpl::PackedBf16)
    label += std::string("(") + ember::cpu::packed_kernel_name(ember::cpu::packed_kernel_for_this_cpu()) + ")";
  label += " MxKxN=" + std::to_string(p.m) + "x" + std::to_string(p.k) + "x" + std::to_string(p.n);
  if (p.batch > 1) label += " batch=" + std::to_string(p.batch);
  label += std::string(p.trans_a ? " A^T" : " A") + (p.trans_b ? " B^T" : " B");
  label += " threads=" + std::to_string(p.threads);
  state.SetLabel(label);
  state.counters["GFLOP/s"] = benchmark::Counter(bench::bert_gemm_flops(p) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// Attention's batched products as Ember runs them: ember::bmm, whose f32 heads take cpu::gemm's
// run-time path (oneDNN's sgemm below kPackedMinWork).
void ember_bmm(benchmark::State& state, bench::BertGemm p, PackedImpl impl) {
  using namespace ember;
  set_num_threads(p.threads);
  const DType dtype = impl == PackedImpl::BmmBf16 ? DType::bf16 : DType::f32;
  auto operand = [&](int64_t rows, int64_t cols, bool transposed) {
    const Tensor t = randn(transposed ? Shape{p.batch, cols, rows} : Shape{p.batch, rows, cols}).to(dtype);
    return transposed ? t.transpose(-1, -2) : t;
  };
  const Tensor a = operand(p.m, p.k, p.trans_a), b = operand(p.k, p.n, p.trans_b);
  for (auto _ : state) {
    Tensor c = bmm(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_packed_label(state, p, impl);
}

void packed_vs_onednn(benchmark::State& state, bench::BertGemm p, PackedImpl impl) {
  using namespace ember;
  set_num_threads(p.threads);
  const cpu::PackedKernel kernel = cpu::packed_kernel_for_this_cpu();
  // Stored shapes: A^T is stored k x m, B^T n x k; batched operands are back to back.
  const int64_t lda = p.trans_a ? p.m : p.k, ldb = p.trans_b ? p.k : p.n, ldc = p.n;
  if (impl == PackedImpl::PackedBf16) {
    const auto a = random_buffer<BFloat16>(p.m * p.k), b = random_buffer<BFloat16>(p.k * p.n);
    std::vector<BFloat16> c(size_t(p.m * p.n));
    for (auto _ : state) {
      cpu::packed_gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), ldc,
                       kernel);
      benchmark::DoNotOptimize(c.data());
      benchmark::ClobberMemory();
    }
  } else {
    const auto a = random_buffer<float>(p.batch * p.m * p.k), b = random_buffer<float>(p.batch * p.k * p.n);
    std::vector<float> c(size_t(p.batch * p.m * p.n));
    const int omp_before = omp_get_max_threads();
    if (impl == PackedImpl::OneDnnF32) omp_set_num_threads(p.threads);
    if (impl == PackedImpl::OneDnnBandsF32) cpu::set_f32_gemm_path(cpu::F32GemmPath::OneDnn);
    for (auto _ : state) {
      switch (impl) {
        case PackedImpl::PackedF32:
          cpu::packed_gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(),
                           ldc, kernel);
          break;
        case PackedImpl::OneDnnF32:
          // Batched: one sgemm per head, as the API offers no batch.
          for (int64_t i = 0; i < p.batch; ++i)
            dnnl_sgemm(p.trans_a ? 'T' : 'N', p.trans_b ? 'T' : 'N', p.m, p.n, p.k, 1.0f, a.data() + i * p.m * p.k,
                       lda, b.data() + i * p.k * p.n, ldb, 0.0f, c.data() + i * p.m * p.n, ldc);
          break;
        default:
          cpu::gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(),
                           ldc);
          break;
      }
      benchmark::DoNotOptimize(c.data());
      benchmark::ClobberMemory();
    }
    omp_set_num_threads(omp_before);
    cpu::set_f32_gemm_path(std::nullopt);
  }
  set_packed_label(state, p, impl);
}

void register_packed() {
  for (const bench::BertGemm& g : bench::bert_gemms()) {
    const bool batched = g.batch > 1;
    const std::vector<PackedImpl> impls =
        batched ? std::vector{PackedImpl::BmmF32, PackedImpl::OneDnnF32, PackedImpl::BmmBf16}
                : std::vector{PackedImpl::PackedF32, PackedImpl::OneDnnF32, PackedImpl::OneDnnBandsF32,
                              PackedImpl::PackedBf16};
    for (PackedImpl impl : impls) {
      if (impl == PackedImpl::OneDnnBandsF32 && g.threads == 1) continue;
      const std::string name = bench::bert_gemm_row_name("packed", g, impl_name(impl));
      auto* b = batched && impl != PackedImpl::OneDnnF32
                    ? benchmark::RegisterBenchmark(name.c_str(), ember_bmm, g, impl)
                    : benchmark::RegisterBenchmark(name.c_str(), packed_vs_onednn, g, impl);
      // Process CPU time: compare_gemm_libs.sh --clock cpu rates 1-thread rows by it.
      b->UseRealTime()->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
    }
  }
}

// ---- bert-mini's fused self-attention, forward and backward

enum class AttentionImpl { Auto, OneDnnF32, AutoBf16 };

void fused_attention(benchmark::State& state, AttentionImpl impl, int threads) {
  using namespace ember;
  constexpr int64_t kBatch = 16, kSeq = 128, kHeads = 4, kHeadDim = 64, kHidden = kHeads * kHeadDim;
  set_num_threads(threads);
  const DType dtype = impl == AttentionImpl::AutoBf16 ? DType::bf16 : DType::f32;
  Tensor qkv = randn({kBatch, kSeq, 3 * kHidden}).to(dtype).requires_grad_();
  // The last eight positions of every sequence are padding, as an additive mask.
  Tensor mask = zeros({kBatch, 1, 1, kSeq});
  mask.narrow(3, kSeq - 8, 8).fill_(-10000.0);
  const Tensor dout = randn({kBatch, kSeq, kHidden}).to(dtype);
  if (impl == AttentionImpl::OneDnnF32) cpu::set_f32_gemm_path(cpu::F32GemmPath::OneDnn);
  for (auto _ : state) {
    packed_self_attention(qkv, kHeads, mask, 0.1, /*training=*/true).backward(dout);
    benchmark::DoNotOptimize(qkv.grad().raw_data());
    qkv.set_grad(Tensor());
  }
  cpu::set_f32_gemm_path(std::nullopt);
  const double products = 7.0 * 2.0 * double(kBatch * kHeads) * double(kSeq) * double(kSeq) * double(kHeadDim);
  state.counters["GFLOP/s"] = benchmark::Counter(products * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(impl == AttentionImpl::OneDnnF32 ? "oneDNN sgemm" : "run-time path") + " " +
                 dtype_name(dtype) + " threads=" + std::to_string(threads));
}

void register_attention() {
  for (int threads : {1, 2})
    for (auto [impl, name] : {std::pair{AttentionImpl::Auto, "auto"}, std::pair{AttentionImpl::OneDnnF32, "onednn_f32"},
                              std::pair{AttentionImpl::AutoBf16, "auto_bf16"}}) {
      const std::string row = std::string("attention/") + name + "/16x128x4x64/" + (threads == 1 ? "1thread" : "2threads");
      benchmark::RegisterBenchmark(row.c_str(), fused_attention, impl, threads)->UseRealTime()->Unit(benchmark::kMillisecond);
    }
}

void register_all() {
  const std::array<std::array<int64_t, 3>, 4> shapes = {
      {{512, 512, 512}, {1024, 1024, 1024}, {2048, 2048, 2048}, {2048, 256, 768}}};
  for (int threads : {1, 2})  // the suffixes below name these two counts
    for (const auto& [m, k, n] : shapes) {
      const Problem p{m, k, n, threads};
      std::string suffix = "/";
      suffix += std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
      suffix += threads == 1 ? "/1thread" : "/2threads";
      for (auto [name, fn] : {std::pair{"ember_matmul", &ember_matmul}, std::pair{"eigen_gemm", &eigen_gemm},
                              std::pair{"ember_matmul_bT", &ember_matmul_bT},
                              std::pair{"eigen_gemm_bT", &eigen_gemm_bT}})
        benchmark::RegisterBenchmark((std::string(name) + suffix).c_str(), fn, p)->UseRealTime()->Unit(benchmark::kMillisecond);
      if ((m == 1024 && k == 1024 && n == 1024) || (m == 2048 && k == 256 && n == 768))
        for (auto [name, fn] : {std::pair{"ember_matmul_bf16", &ember_matmul_bf16},
                                std::pair{"ember_matmul_bT_bf16", &ember_matmul_bT_bf16}})
          benchmark::RegisterBenchmark((std::string(name) + suffix).c_str(), fn, p)->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  register_bf16_paths();
  register_packed();
  register_attention();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  bench::ProgressReporter reporter("bench_matmul");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
