// Ember's f32 and bf16 matmul against Eigen's f32 GEMM called directly, in one binary, at 1 and 2 threads.
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
// Ember runs Eigen's single-threaded GEMM on bands of C spread over its own thread pool;
// eigen_* use Eigen's own OpenMP threading (Eigen::setNbThreads), the usual way to run it.
// Benchmarks are registered shape by shape, Ember next to Eigen, so both see the same machine.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <array>
#include <string>

#include "ember/ember.h"

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
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
