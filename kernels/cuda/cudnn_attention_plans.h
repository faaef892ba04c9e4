// Scaled-dot-product attention on cuDNN's fused flash-attention engines, through the graph
// (backend) API: the problem as cuDNN sees it and the execution plans built for it, cached per
// thread by shape, layout and flags.
//
// Forward graph (f32 compute, the score tensors virtual):
//   S = matmul(Q, Kᵀ) · scale  [→ causal: select(S, lowest float) where col > row (gen-index)]
//   m = max_j S, e = exp(S - m), l = Σ_j e, Stats = m + log(l) (f32 [b, h, s_q, 1]),
//   O = matmul(e / l, V)
// Backward graph (dQ written by its own matmul, no atomically accumulated f32 dQ: deterministic):
//   δ = Σ_d dO·O,  P = exp(S - Stats) (S as above),  dV = matmul(Pᵀ, dO),
//   dS = P · (matmul(dO, Vᵀ) - δ) · scale,  dK = matmul(dSᵀ, Q),  dQ = matmul(dS, K)
// Engines cuDNN marks nondeterministic are skipped. Any step cuDNN refuses (a descriptor, the
// graph, the heuristics, every engine) declines the problem; the refusal is remembered for the
// problem's key, so it is asked once.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ember::cuda {

// One operand's strides in elements over [b, h, rows, cols] (cols contiguous).
using AttentionStrides = std::array<int64_t, 3>;

struct CudnnAttentionProblem {
  DType dtype = DType::bf16;  // f16 or bf16
  int64_t b = 0, h = 0, s_q = 0, s_kv = 0, d = 0;  // one head dim for q, k and v
  bool causal = false;
  AttentionStrides q{}, k{}, v{}, o{};       // forward and backward
  AttentionStrides d_o{}, dq{}, dk{}, dv{};  // backward only
};

// The pointers of one call: device memory except where noted.
struct CudnnAttentionForwardArgs {
  const void *q, *k, *v;
  void* o;
  float* stats;  // [b, h, s_q] logsumexp of the scaled scores, packed
  float scale;   // host value
};
struct CudnnAttentionBackwardArgs {
  const void *q, *k, *v, *o, *d_o;
  const float* stats;  // as the forward wrote it
  void *dq, *dk, *dv;
  float scale;
};

// Run the pass on the current device and stream; false (nothing written) when cuDNN declines.
bool run_cudnn_attention_forward(const CudnnAttentionProblem& p, const CudnnAttentionForwardArgs& args);
bool run_cudnn_attention_backward(const CudnnAttentionProblem& p, const CudnnAttentionBackwardArgs& args);

// Keys cached for the calling thread (plans and remembered refusals).
size_t cudnn_attention_plan_count();

}  // namespace ember::cuda
