// Which implementation runs the bf16 GEMM (cpu::gemm on BFloat16 operands, see gemm.h).
//
//   onednn      oneDNN's bf16 matmul primitive (AMX kernels where the CPU has AMX, its
//               AVX512-BF16 kernels otherwise); products too small to repay a primitive, and
//               odd inner dimensions, run on the AVX512-BF16 kernel (or widened without it).
//   avx512bf16  Ember's own blocked kernel on vdpbf16ps (gemm_bf16_avx512.h).
//   widened     operands converted to f32 and multiplied by the f32 GEMM.
//   amx         Ember's own AMX tile kernel (gemm_bf16_amx.h), where the CPU has AMX-BF16 and
//               Linux grants the tile state. Forced only: it has not been measured on an AMX
//               machine yet, so the automatic choice there stays onednn until it is.
//
// The automatic choice follows measurements (see gemm_bf16.cpp); EMBER_BF16_GEMM=onednn,
// avx512bf16, widened or amx forces one (read at the first bf16 GEMM). Forcing a path the CPU,
// or EMBER_CPU_CAPABILITY, does not allow is an ember::Error.
#pragma once
#include <optional>
#include <string>

namespace ember::cpu {

enum class Bf16GemmPath { OneDnn, Avx512Bf16, Widened, Amx };

const char* bf16_gemm_path_name(Bf16GemmPath path);
// Whether this CPU, under the current EMBER_CPU_CAPABILITY, can run the path.
bool bf16_gemm_path_available(Bf16GemmPath path);
// The path bf16 GEMMs take now.
Bf16GemmPath bf16_gemm_path();
// Forces a path for this process (tests, benchmarks); std::nullopt returns to the automatic
// choice. An unavailable path is an ember::Error.
void set_bf16_gemm_path(std::optional<Bf16GemmPath> path);
// The instruction set oneDNN's kernels use here, e.g. "avx512_core_amx" (DNNL_MAX_CPU_ISA caps it).
std::string onednn_cpu_isa_name();

}  // namespace ember::cpu
