// 2-D convolutions on cuDNN's graph API: the problem as cuDNN sees it, and the execution plan
// chosen for it, cached per shape.
//
// Choice (PyTorch's cudnn.benchmark = False, cudnn.deterministic = True, allow_tf32 as set):
// cuDNN's heuristics list engine configurations best first (mode A, then the fallback list);
// the first one that supports the problem wins, skipping those cuDNN marks nondeterministic
// (Ember's GPU results do not vary between runs), those that compute f32 on TF32 tensor cores
// unless TF32 is allowed (cuda::allow_tf32, shared with the GEMMs), and those that round f32 or
// f64 inputs down. With benchmarking on (EMBER_CUDNN_BENCHMARK=1 or set_cudnn_benchmark), up to
// kBenchmarkCandidates supported configurations are timed on the call's own buffers and the
// fastest kept. A plan is cached for the calling thread by device, pass, dtype, shapes, strides,
// geometry, pointer alignment and those two switches, so each shape pays for the choice once.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ember::cuda {

enum class CudnnConvPass { Forward, BackwardData, BackwardFilter };

// x [N, C, H, W] (dims and element strides: x may be a narrowed view of a larger tensor),
// w [O, C / groups, kH, kW] and y [N, O, Ho, Wo], both packed; geometry per spatial dim
// {height, width}. cuDNN derives the groups from C / w's second dim. y's size must equal
// (H + pre + post - dilation * (k - 1) - 1) / stride + 1 exactly.
struct CudnnConvProblem {
  CudnnConvPass pass = CudnnConvPass::Forward;
  DType dtype = DType::f32;
  std::array<int64_t, 4> x_dims{}, x_strides{}, w_dims{}, y_dims{};
  std::array<int64_t, 2> stride{1, 1}, pre_padding{0, 0}, post_padding{0, 0}, dilation{1, 1};
  int64_t alignment = 16;  // bytes every pointer is aligned to (at most 16)
};

// Runs one pass on the current device and stream, writing its output whole:
//   Forward y = conv(x, w); BackwardData x = the input gradient of y; BackwardFilter w = the
//   weight gradient of y and x. Raises ember::Error naming the pass and shapes when no engine
//   supports the problem.
void run_cudnn_conv(const CudnnConvProblem& problem, void* x, void* w, void* y);

inline constexpr int kBenchmarkCandidates = 8;
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();

// Plans cached for the calling thread (all devices).
size_t cudnn_conv_plan_count();

}  // namespace ember::cuda
