// Which kernel runs an f32 GEMM band (gemm.cpp): Ember's packed GEMM (gemm_packed.h), oneDNN
// 2.6's sgemm, or Intel MKL's where it is installed.
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
// On an Intel Xeon with AVX-512 (family 6 model 207, 2 cores, no AMX or AVX512-BF16 exposed;
// measured FMA peak 178 GFLOP/s per core; bench_matmul's packed/ rows, one thread, medians of 3):
//
//   shape                                    oneDNN sgemm   packed (AVX-512 12x32)
//   fc1        2048x256x1024    X W^T             165           149
//   dX         2048x1024x256    dY W              168           150
//   dW         1024x2048x256    dY^T X            123           146
//   dW         256x2048x1024    dY^T X            151           136
//   bert-base  2048x768x3072    X W^T             155           139
//   bert-base  3072x2048x768    dY^T X            158           139
//   bert-base  768x2048x3072    dY^T X            154           131
//   decoder    2048x256x30522   X W^T             152           134
//   decoder dX 2048x30522x256   dY W              147           134
//   decoder dW 30522x2048x256   dY^T X            100           123
//
// There oneDNN's AVX-512 sgemm is 8-15% ahead on every shape but the weight gradients of a
// 256-wide layer (A transposed, n = 256), where its transposed-A path drops to 100-123 and the
// packed GEMM leads by 19-23%. (The packed kernel alone, its panels in cache, runs at 189
// GFLOP/s; inside the GEMM it loses mostly to C's traffic beyond L2.)
//
// Intel MKL's sgemm (kernels/cpu/mkl_sgemm.h; MKL 2026.2 from PyPI, its AVX-512 path) on that
// Xeon, one thread, best of 2 alternating runs in a noisy hour:
//
//   shape                                    oneDNN sgemm   packed   MKL sgemm
//   fc1        2048x256x1024    X W^T             180          141       173
//   fc2        2048x1024x256    X W^T             132          117       165
//   dW         1024x2048x256    dY^T X            130          143       154
//   bert-base  2048x768x3072    X W^T             136          127       173
//   bert-base  2048x3072x768    dY W              132          133       176
//   decoder dW 30522x2048x256   dY^T X            103          134       147
//
// and in Ember's bands (cpu::gemm, best of 6) at 2 threads on bert-base's products oneDNN and
// MKL were level (228-356 GFLOP/s each, within 3% shape by shape), and bert-base's training
// step was no faster with MKL (best of 5 alternating runs: 4.6 s with MKL, 3.8 s without; the
// hour's noise moved single runs by 2x). So MKL is not chosen automatically; EMBER_F32_GEMM=mkl
// runs every f32 product on it where it is installed.
//
// Inside bert-mini's training step some products run at another speed than alone.
// EMBER_GEMM_PROFILE=1 build/bench/bert_train --config bert-mini --task cls (kernels/cpu/
// gemm_profile.h; each path forced in turn with EMBER_F32_GEMM, alternating, best of 4 rounds,
// same Xeon, 2 threads; GFLOP/s a thread for attention's heads, each run by one thread inside
// the attention's parallel region, for the whole product otherwise):
//
//   product                        MxKxN          oneDNN sgemm   packed
//   P V, dS K (per head)           128x128x64          90          145   (A and B in place)
//   P^T dO, dS^T Q (per head)      128x128x64         134          147   (A and B in place)
//   Q K^T, dO V^T (per head)       128x64x128         123          113   (A in place, B^T packed)
//   wgrad, attention output        256x2048x256       308          256
//   wgrad, fused QKV               768x2048x256       322          292
//   wgrad, FFN in                  1024x2048x256      262          300
//
// Alone (bench_matmul's attention/ rows: the same fused attention, forward and backward, under
// the same profile) oneDNN runs P V at 140 and the in-place packed GEMM at 146; what slows
// oneDNN's small products inside the step was not pinned down. So the packed GEMM runs the
// small products it can read in place, and a narrow transposed-A product only when it is tall
// (kAvx512PackedMinM): it packs each chunk of B for fewer rows of A than that and loses to
// oneDNN there.
//
// Dispatch (f32_gemm_path_for): products under kPackedMinWork multiply-adds go to oneDNN, but
// for those the AVX-512 packed GEMM runs with its operands in place (B not transposed, 32 to
// kInPlaceMaxN columns). Above
// it, the packed GEMM takes every product where it runs its AVX2 kernel, and where it runs its
// AVX-512 kernel the products with a transposed A at most kAvx512PackedMaxN wide and at least
// kAvx512PackedMinM tall; oneDNN the rest.
// cpu::gemm chooses once per product, before cutting it into bands, so the thread count does not
// change the kernel.
// EMBER_F32_GEMM=onednn|packed|mkl (or set_f32_gemm_path) forces one.
#pragma once
#include <cstdint>
#include <optional>

namespace ember::cpu {

enum class F32GemmPath { OneDnn = 0, Packed = 1, Mkl = 2 };

// Below this many multiply-adds (a 128^3 product) oneDNN's sgemm is faster.
inline constexpr double kPackedMinWork = 128.0 * 128.0 * 128.0;
// The widest transposed-A product the AVX-512 kernel takes from oneDNN (measured above).
inline constexpr int64_t kAvx512PackedMaxN = 256;
// ... and the shortest (measured above).
inline constexpr int64_t kAvx512PackedMinM = 1024;

const char* f32_gemm_path_name(F32GemmPath path);
// The path an m x n x k product takes (trans_a: A is stored k x m, as in a weight gradient;
// trans_b: B is stored n x k); an EMBER_F32_GEMM value other than onednn, packed or mkl is an
// ember::Error naming it.
F32GemmPath f32_gemm_path_for(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b);
// Forces one path for every product (tests, benchmarks); std::nullopt restores the automatic choice.
void set_f32_gemm_path(std::optional<F32GemmPath> path);

}  // namespace ember::cpu
