// Which kernel runs an f32 GEMM band (gemm.cpp): Ember's packed GEMM (gemm_packed.h) or
// oneDNN 2.6's sgemm.
//
// Measured (GFLOP/s, best of 5, one thread, f32; AMD EPYC Zen 3, AVX2 + FMA, whose measured
// FMA peak is 100 GFLOP/s per core: build/bench/machine_limits), MxKxN:
//
//   shape                                    oneDNN sgemm   packed (AVX2 6x16)
//   fc1        2048x256x1024    X W^T              93            95
//   fc2        2048x1024x256    X W^T              79            86
//   dX         2048x1024x256    dY W               81            85
//   dW         1024x2048x256    dY^T X             38            85
//   decoder    2048x256x30522   X W^T              94            89
//   decoder dX 2048x30522x256   dY W               73            82
//   decoder dW 30522x2048x256   dY^T X             68            82
//   bert-base  2048x768x3072    X W^T              90            91
//   bert-base  3072x2048x768    dY^T X             89            92
//   attention  128x64x128       Q K^T              93            82
//
// The packed GEMM holds 82-95% of the FMA peak on every training shape, where oneDNN's sgemm
// falls to 38% on the weight gradient's transposed left operand; oneDNN stays ahead on small
// products (its packing is cheaper there), such as attention's per-head ones.
//
// Dispatch (f32_gemm_path_for): products under kPackedMinWork multiply-adds go to oneDNN, the
// rest to the packed GEMM, on CPUs where the packed GEMM runs its AVX2 kernel (the one measured
// above). Where it would run its AVX-512 kernel, oneDNN's AVX-512 sgemm keeps every product
// until the two are measured side by side there (bench_matmul's packed/* rows).
// EMBER_F32_GEMM=onednn|packed (or set_f32_gemm_path) forces one.
#pragma once
#include <cstdint>
#include <optional>

namespace ember::cpu {

enum class F32GemmPath { OneDnn = 0, Packed = 1 };

// Below this many multiply-adds (a 128^3 product) oneDNN's sgemm is faster.
inline constexpr double kPackedMinWork = 128.0 * 128.0 * 128.0;

const char* f32_gemm_path_name(F32GemmPath path);
// The path an m x n x k product takes; an EMBER_F32_GEMM value other than onednn or packed is
// an ember::Error naming it.
F32GemmPath f32_gemm_path_for(int64_t m, int64_t n, int64_t k);
// Forces one path for every product (tests, benchmarks); std::nullopt restores the automatic choice.
void set_f32_gemm_path(std::optional<F32GemmPath> path);

}  // namespace ember::cpu
