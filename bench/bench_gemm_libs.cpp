// Intel MKL and a current oneDNN (the PyPI wheels of scripts/install_bench_libs.sh) at the BERT
// training GEMMs that bench_matmul's packed/ rows time with Ember's packed GEMM and Debian's
// oneDNN 2.6 (bench/bert_gemm_shapes.h). A program of its own: oneDNN 3 and 2.6 export the same
// C symbols, so it links neither Ember (which links oneDNN 2.6) nor Debian's oneDNN.
// bench/compare_gemm_libs.sh runs it and bench_matmul alternately and prints one table.
//
//   libs/<layout>/<impl>/<shape>/<threads>
//     mkl_f32       cblas_sgemm, row-major (cblas_sgemm_batch_strided when batched)
//     mkl_bf16      cblas_gemm_bf16bf16f32: bf16 in, f32 out (MKL has no bf16 out), one call
//                   per head when batched
//     onednn3_f32   dnnl_sgemm, one call per head when batched. The PyPI oneDNN is built with
//                   the SYCL runtime: its primitives (matmul, so bf16) need a SYCL CPU device
//                   that the wheels do not provide; dnnl_sgemm runs without an engine.
// Threads: mkl_set_num_threads for MKL (its OpenMP runtime), tbb::global_control for oneDNN
// (its TBB runtime). Run one library per process (--benchmark_filter=/mkl_ or /onednn3_) so the
// other's idle threads do not spin beside it. Labels name the code path each library chose:
// MKL's (mkl_get_version's Processor; "generic" for its "Intel(R) Architecture processors"
// path) and oneDNN's (dnnl_get_effective_cpu_isa).
#include <benchmark/benchmark.h>
#include <mkl.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/tbb/global_control.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bert_gemm_shapes.h"

namespace {

enum class Impl { MklF32, MklBf16, OneDnnF32 };

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::MklF32: return "mkl_f32";
    case Impl::MklBf16: return "mkl_bf16";
    case Impl::OneDnnF32: return "onednn3_f32";
  }
  return "?";
}

// The code path MKL took, as its version record names it: "Intel(R) Architecture processors" is
// its generic path, other values name the ISA ("... AVX2 enabled processors" and so on).
std::string mkl_processor() {
  MKLVersion version;
  mkl_get_version(&version);
  return version.Processor;
}

std::string mkl_path_name() {
  const std::string processor = mkl_processor();
  for (const char* isa : {"AVX-512", "AVX512", "AVX10", "AVX2", "AVX", "SSE4_2", "SSE4.2"})
    if (processor.find(isa) != std::string::npos) return isa;
  return processor.find("Architecture processors") != std::string::npos ? "generic" : processor;
}

const char* onednn_isa_name() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2_vnni_2: return "avx2_vnni_2";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

std::vector<float> random_floats(int64_t count) {
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(gen);
  return v;
}

// Round to nearest even, as Ember's BFloat16 does (the values here are finite).
std::vector<MKL_BF16> to_bf16(const std::vector<float>& f) {
  std::vector<MKL_BF16> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &f[i], sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    out[i] = static_cast<MKL_BF16>(bits >> 16);
  }
  return out;
}

void run_gemm(benchmark::State& state, bench::BertGemm g, Impl impl) {
  const bool mkl = impl != Impl::OneDnnF32;
  if (mkl) mkl_set_num_threads(g.threads);
  // oneDNN's TBB runtime: at most g.threads workers while this case runs.
  std::unique_ptr<tbb::global_control> tbb_threads;
  if (!mkl) tbb_threads = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, g.threads);

  // Stored shapes: A^T is stored k x m, B^T n x k; batched operands are back to back.
  const int64_t lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n, ldc = g.n;
  const int64_t a_size = g.m * g.k, b_size = g.k * g.n, c_size = g.m * g.n;
  const std::vector<float> a = random_floats(g.batch * a_size), b = random_floats(g.batch * b_size);
  const std::vector<MKL_BF16> a16 = to_bf16(a), b16 = to_bf16(b);
  std::vector<float> c(size_t(g.batch * c_size));
  const CBLAS_TRANSPOSE ta = g.trans_a ? CblasTrans : CblasNoTrans, tb = g.trans_b ? CblasTrans : CblasNoTrans;
  for (auto _ : state) {
    switch (impl) {
      case Impl::MklF32:
        if (g.batch == 1)
          cblas_sgemm(CblasRowMajor, ta, tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), ldc);
        else
          cblas_sgemm_batch_strided(CblasRowMajor, ta, tb, g.m, g.n, g.k, 1.0f, a.data(), lda, a_size, b.data(), ldb,
                                    b_size, 0.0f, c.data(), ldc, c_size, g.batch);
        break;
      case Impl::MklBf16:
        for (int64_t i = 0; i < g.batch; ++i)
          cblas_gemm_bf16bf16f32(CblasRowMajor, ta, tb, g.m, g.n, g.k, 1.0f, a16.data() + i * a_size, lda,
                                 b16.data() + i * b_size, ldb, 0.0f, c.data() + i * c_size, ldc);
        break;
      case Impl::OneDnnF32:
        for (int64_t i = 0; i < g.batch; ++i)
          dnnl_sgemm(g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', g.m, g.n, g.k, 1.0f, a.data() + i * a_size, lda,
                     b.data() + i * b_size, ldb, 0.0f, c.data() + i * c_size, ldc);
        break;
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  std::string label = std::string(impl_name(impl)) + "(" + (mkl ? mkl_path_name() : std::string(onednn_isa_name())) + ")";
  label += " MxKxN=" + std::to_string(g.m) + "x" + std::to_string(g.k) + "x" + std::to_string(g.n);
  if (g.batch > 1) label += " batch=" + std::to_string(g.batch);
  label += std::string(g.trans_a ? " A^T" : " A") + (g.trans_b ? " B^T" : " B");
  label += " threads=" + std::to_string(g.threads);
  state.SetLabel(label);
  state.counters["GFLOP/s"] =
      benchmark::Counter(bench::bert_gemm_flops(g) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  char mkl_version[256];
  mkl_get_version_string(mkl_version, sizeof mkl_version);
  benchmark::AddCustomContext("mkl", mkl_version);
  benchmark::AddCustomContext("mkl_path", mkl_processor());
  const dnnl_version_t* v = dnnl_version();
  benchmark::AddCustomContext("onednn", std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                                            std::to_string(v->patch));
  for (const bench::BertGemm& g : bench::bert_gemms())
    for (Impl impl : {Impl::MklF32, Impl::MklBf16, Impl::OneDnnF32})
      benchmark::RegisterBenchmark(bench::bert_gemm_row_name("libs", g, impl_name(impl)).c_str(), run_gemm, g, impl)
          ->UseRealTime()
          ->MeasureProcessCPUTime()  // every thread a library starts (compare_gemm_libs.sh --clock cpu)
          ->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
