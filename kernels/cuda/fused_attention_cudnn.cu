// Attention on cuDNN: the library stubs of core/native/fused.h on cuDNN's fused flash-attention
// engines (kernels/cuda/cudnn_attention_plans.cpp builds and caches the graphs).
//
// Taken: f16 and bf16 q, k and v of one head dim, a multiple of 8 up to kCudnnAttentionMaxHeadDim;
// no additive mask (causal or none); no dropout (Ember's dropout mask comes from its own Philox
// stream, which cuDNN's cannot reproduce, and the backward must see the forward's mask); every
// operand 16-byte aligned with its row, head and batch strides multiples of 8 elements. Anything
// else, and any problem cuDNN refuses, runs Ember's kernels.
//
// The forward writes cuDNN's per-row logsumexp into Ember's stats as (logsumexp, 1): Ember's
// backward kernels read a row as (max, 1 / sum) and form exp(s - max) / sum, which is the same
// exp(s - logsumexp). The backward needs the output O, which Ember does not save (saving the
// result would make a reference cycle), so it recomputes O and the logsumexp with the forward
// plan first.
#include <atomic>
#include <cstdint>

#include "core/factory.h"
#include "core/native/fused.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_attention_plans.h"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace cuda {
namespace {

// Off by default: the operation graphs have not yet run on a device (tests/cuda/
// test_cuda_attention_cudnn.cpp turns it on; the device check runs them).
EnvSwitch cudnn_attention_switch{"EMBER_CUDNN_ATTENTION", false};

std::atomic<int64_t> forward_calls{0}, backward_calls{0}, declined_calls{0};

bool decline() {
  declined_calls.fetch_add(1);
  return false;
}

bool takes_shape(DType dt, int64_t dim_qk, int64_t dim_v, bool masked, double dropout_p) {
  if (!cudnn_attention_switch.get()) return false;
  if (dt != DType::f16 && dt != DType::bf16) return false;
  if (dim_qk != dim_v || dim_qk % 8 != 0 || dim_qk < 8 || dim_qk > kCudnnAttentionMaxHeadDim) return false;
  return !masked && dropout_p == 0.0;
}

// An operand's [b, h, rows] strides as cuDNN gets them: a dim of size 1 gets the stride a packed
// layout would give it (its own is arbitrary, 0 for a broadcast one).
AttentionStrides strides_of(const native::AttentionOperand& o, int64_t outer, int64_t inner, int64_t rows,
                            int64_t cols) {
  const int64_t row = rows == 1 ? cols : o.row_stride;
  const int64_t head = inner == 1 ? rows * row : o.inner_stride;
  const int64_t batch = outer == 1 ? inner * head : o.outer_stride;
  return {batch, head, row};
}

// cuDNN reads every operand in 16-byte pieces: aligned data, strides of whole pieces, no two
// (batch, head) pairs on one memory (a broadcast operand is declined, not repeated).
bool aligned(const native::AttentionOperand& o, const AttentionStrides& s) {
  if (reinterpret_cast<uintptr_t>(o.data.raw_data()) % 16 != 0) return false;
  for (int64_t stride : s)
    if (stride <= 0 || stride % 8 != 0) return false;
  return true;
}

struct Layout {
  CudnnAttentionProblem problem;
  bool ok = false;
};

// The problem as cuDNN sees it with `out` as O (its own layout checked here; the backward's
// gradients are added by the caller).
Layout layout_of(const native::AttentionProblem& a, const native::AttentionOperand& out) {
  Layout l;
  CudnnAttentionProblem& p = l.problem;
  p.dtype = a.q.data.dtype();
  p.b = a.outer;
  p.h = a.inner;
  p.s_q = a.len_q;
  p.s_kv = a.len_k;
  p.d = a.dim_qk;
  p.causal = a.causal;
  p.q = strides_of(a.q, a.outer, a.inner, a.len_q, a.dim_qk);
  p.k = strides_of(a.k, a.outer, a.inner, a.len_k, a.dim_qk);
  p.v = strides_of(a.v, a.outer, a.inner, a.len_k, a.dim_qk);
  p.o = strides_of(out, a.outer, a.inner, a.len_q, a.dim_qk);
  l.ok = aligned(a.q, p.q) && aligned(a.k, p.k) && aligned(a.v, p.v) && aligned(out, p.o);
  return l;
}

// Whether the library is asked at all (everything but cuDNN's own answer).
bool within_limits(const native::AttentionProblem& a) {
  if (!takes_shape(a.q.data.dtype(), a.dim_qk, a.dim_v, a.mask.defined(), 0.0)) return false;
  return a.pairs() > 0 && a.len_q > 0 && a.len_k > 0;
}

__global__ void logsumexp_to_stats(float* stats, const float* lse, int64_t rows) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  stats[2 * i] = lse[i];
  stats[2 * i + 1] = 1.0f;
}

bool attention_forward_cudnn(const native::AttentionProblem& a, const native::AttentionOperand& out,
                             const Tensor& stats, const native::FusedDropout& dropout) {
  constexpr const char* op = "scaled_dot_product_attention (cuDNN)";
  if (!within_limits(a) || dropout.active()) return decline();
  if (stats.dtype() != DType::f32 || !stats.is_contiguous()) return decline();
  const Layout l = layout_of(a, out);
  if (!l.ok) return decline();
  const Device dev = a.q.data.device();
  DeviceGuard guard(dev, op);
  const int64_t rows = a.pairs() * a.len_q;
  const Tensor lse = empty({rows}, {DType::f32, dev});
  const CudnnAttentionForwardArgs args{a.q.data.raw_data(), a.k.data.raw_data(), a.v.data.raw_data(),
                                       out.data.raw_data(), static_cast<float*>(lse.raw_data()), float(a.scale)};
  if (!run_cudnn_attention_forward(l.problem, args)) return decline();
  constexpr int kThreads = 256;
  logsumexp_to_stats<<<unsigned((rows + kThreads - 1) / kThreads), kThreads, 0, current_stream()>>>(
      static_cast<float*>(stats.raw_data()), static_cast<const float*>(lse.raw_data()), rows);
  EMBER_CUDA_CHECK_LAUNCH();
  forward_calls.fetch_add(1);
  return true;
}

bool attention_backward_cudnn(const native::AttentionProblem& a, const native::AttentionOperand& grad,
                              const native::AttentionOperand& dq, const native::AttentionOperand& dk,
                              const native::AttentionOperand& dv, const Tensor& stats, const Tensor& keep,
                              double dropout_scale) {
  constexpr const char* op = "scaled_dot_product_attention_backward (cuDNN)";
  (void)stats;  // recomputed with O below
  if (!within_limits(a) || keep.defined() || dropout_scale != 1.0) return decline();
  const Device dev = a.q.data.device();
  const DType dt = a.q.data.dtype();
  // O recomputed into a packed [b, h, s_q, d] tensor
  const Tensor o = empty({a.outer, a.inner, a.len_q, a.dim_v}, {dt, dev});
  const native::AttentionOperand o_operand{o, o.strides()[0], o.strides()[1], o.strides()[2]};
  Layout l = layout_of(a, o_operand);
  CudnnAttentionProblem& p = l.problem;
  p.d_o = strides_of(grad, a.outer, a.inner, a.len_q, a.dim_qk);
  p.dq = strides_of(dq, a.outer, a.inner, a.len_q, a.dim_qk);
  p.dk = strides_of(dk, a.outer, a.inner, a.len_k, a.dim_qk);
  p.dv = strides_of(dv, a.outer, a.inner, a.len_k, a.dim_qk);
  if (!l.ok || !aligned(grad, p.d_o) || !aligned(dq, p.dq) || !aligned(dk, p.dk) || !aligned(dv, p.dv))
    return decline();
  DeviceGuard guard(dev, op);
  const Tensor lse = empty({a.pairs() * a.len_q}, {DType::f32, dev});
  float* lse_ptr = static_cast<float*>(lse.raw_data());
  const CudnnAttentionForwardArgs fwd{a.q.data.raw_data(), a.k.data.raw_data(), a.v.data.raw_data(), o.raw_data(),
                                      lse_ptr, float(a.scale)};
  if (!run_cudnn_attention_forward(p, fwd)) return decline();
  const CudnnAttentionBackwardArgs bwd{a.q.data.raw_data(), a.k.data.raw_data(), a.v.data.raw_data(),
                                       o.raw_data(),        grad.data.raw_data(), lse_ptr,
                                       dq.data.raw_data(),  dk.data.raw_data(),   dv.data.raw_data(),
                                       float(a.scale)};
  if (!run_cudnn_attention_backward(p, bwd)) return decline();
  backward_calls.fetch_add(1);
  return true;
}

}  // namespace

void set_cudnn_attention(bool on) { cudnn_attention_switch.set(on); }
bool cudnn_attention() { return cudnn_attention_switch.get(); }

CudnnAttentionCounts cudnn_attention_counts() {
  return {forward_calls.load(), backward_calls.load(), declined_calls.load()};
}

}  // namespace cuda

EMBER_REGISTER_KERNEL(native::attention_library_stub, CUDA, &cuda::attention_forward_cudnn);
EMBER_REGISTER_KERNEL(native::attention_library_backward_stub, CUDA, &cuda::attention_backward_cudnn);
EMBER_REGISTER_KERNEL(native::attention_library_takes_stub, CUDA, &cuda::takes_shape);

}  // namespace ember
