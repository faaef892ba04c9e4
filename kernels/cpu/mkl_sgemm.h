// Intel MKL's sgemm, loaded at run time where it is installed, for EMBER_F32_GEMM=mkl (an
// opt-in: measured, it did not beat the automatic choice; see gemm_f32_path.h). No build-time
// dependency: nothing of MKL is needed to build or run Ember.
//
// Where it is looked for, first found wins:
//   EMBER_MKL_LIBRARY   a path to libmkl_rt (or "none": never load MKL)
//   $EMBER_BENCH_LIBS/lib/libmkl_rt.so.3 (default ~/.cache/ember-bench-libs, where
//                       scripts/install_bench_libs.sh puts MKL from PyPI)
//   libmkl_rt.so.3, libmkl_rt.so.2, libmkl_rt.so through the dynamic loader's own search
// It is loaded with MKL's sequential threading layer and the LP64 interface: Ember's pool
// already cuts a product into one band per thread (gemm_bands.h), and each band is one
// single-threaded MKL call, so no OpenMP or TBB runtime of MKL's ever starts.
#pragma once
#include <cstdint>
#include <string>

namespace ember::cpu {

struct MklStatus {
  bool loaded = false;
  std::string library;  // the file loaded, or every place tried
  std::string version;  // MKL's version string when loaded
  std::string problem;  // why it is not loaded (empty when it is)
};

// Loads MKL once per process (thread-safe) and reports what happened.
const MklStatus& mkl_status();
// Tries one library file, as the process-wide load does for each place it looks; a file that
// is not MKL's runtime library (or lacks a function Ember calls) reports why. For tests.
MklStatus probe_mkl_library(const std::string& path);

// One single-threaded cblas_sgemm, row-major, with cpu::gemm's contract (gemm.h). MKL not
// loaded, or a dimension past MKL's 32-bit integers, is an ember::Error.
void mkl_sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace ember::cpu
