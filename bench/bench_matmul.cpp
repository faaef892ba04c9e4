// Ember's f32 matmul against Eigen's GEMM called directly, in one binary, at 1 and 2 threads.
// Shapes are M x K x N: [M, K] @ [K, N]. "GFLOP/s" counts 2*M*K*N floating-point operations per
// product. Times are wall-clock (the GEMM threads with OpenMP).
//
//   BM_EmberMatmul            ember::matmul(a [M,K], b [K,N]), output allocated per call
//   BM_EmberMatmulTransposedB ember::matmul(a, w.t()) with w [N,K]: the linear-layer layout
//   BM_EigenGemm              C.noalias() = A * B on preallocated row-major Eigen matrices
//   BM_EigenGemmTransposedB   C.noalias() = A * W.transpose()
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

Problem setup(benchmark::State& state) {
  const Problem p{state.range(0), state.range(1), state.range(2), int(state.range(3))};
  ember::set_num_threads(p.threads);
  Eigen::setNbThreads(p.threads);
  state.SetLabel("MxKxN=" + std::to_string(p.m) + "x" + std::to_string(p.k) + "x" + std::to_string(p.n) +
                 " threads=" + std::to_string(p.threads));
  return p;
}

void count_flops(benchmark::State& state, const Problem& p) {
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(p.m) * double(p.k) * double(p.n) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

RowMatrix eigen_copy(const ember::Tensor& t) {
  const ember::Tensor c = t.contiguous();
  return Eigen::Map<const RowMatrix>(c.data_ptr<float>(), c.size(0), c.size(1));
}

void BM_EmberMatmul(benchmark::State& state) {
  const Problem p = setup(state);
  const ember::Tensor a = ember::randn({p.m, p.k}), b = ember::randn({p.k, p.n});
  for (auto _ : state) {
    ember::Tensor c = ember::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  count_flops(state, p);
}

void BM_EmberMatmulTransposedB(benchmark::State& state) {
  const Problem p = setup(state);
  const ember::Tensor a = ember::randn({p.m, p.k}), w = ember::randn({p.n, p.k});
  for (auto _ : state) {
    ember::Tensor c = ember::matmul(a, w.t());
    benchmark::DoNotOptimize(c.raw_data());
  }
  count_flops(state, p);
}

void BM_EigenGemm(benchmark::State& state) {
  const Problem p = setup(state);
  const RowMatrix a = eigen_copy(ember::randn({p.m, p.k})), b = eigen_copy(ember::randn({p.k, p.n}));
  RowMatrix c(p.m, p.n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  count_flops(state, p);
}

void BM_EigenGemmTransposedB(benchmark::State& state) {
  const Problem p = setup(state);
  const RowMatrix a = eigen_copy(ember::randn({p.m, p.k})), w = eigen_copy(ember::randn({p.n, p.k}));
  RowMatrix c(p.m, p.n);
  for (auto _ : state) {
    c.noalias() = a * w.transpose();
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  count_flops(state, p);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (auto [m, k, n] : {std::array<int64_t, 3>{512, 512, 512}, std::array<int64_t, 3>{1024, 1024, 1024},
                           std::array<int64_t, 3>{2048, 2048, 2048}, std::array<int64_t, 3>{2048, 256, 768}})
      b->Args({m, k, n, threads});
  b->ArgNames({"M", "K", "N", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_EmberMatmul)->Apply(shapes);
BENCHMARK(BM_EigenGemm)->Apply(shapes);
BENCHMARK(BM_EmberMatmulTransposedB)->Apply(shapes);
BENCHMARK(BM_EigenGemmTransposedB)->Apply(shapes);

BENCHMARK_MAIN();
