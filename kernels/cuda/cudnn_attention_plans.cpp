#include "kernels/cuda/cudnn_attention_plans.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_backend.h"

namespace ember::cuda {
namespace {

// The graph's tensors with data (the variant pack's ids); virtual tensors number from kVirtual.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kLowest, kOne, kDO, kDQ, kDK, kDV, kVirtual = 100 };

enum class Pass : int64_t { Forward, Backward };

using Dims = std::vector<int64_t>;

Dims packed_strides(const Dims& dims) {
  Dims s(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

// [b, h, rows, cols] with cols contiguous, or its transpose [b, h, cols, rows] (same memory).
Dims strides_of(const AttentionStrides& s) { return {s[0], s[1], s[2], 1}; }
Dims transposed_strides_of(const AttentionStrides& s) { return {s[0], s[1], 1, s[2]}; }

// An operation graph under construction; every descriptor it makes lives as long as it does.
class GraphBuilder {
 public:
  using Raw = cudnnBackendDescriptor_t;

  Raw tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides, bool is_virtual = false,
             bool by_value = false) {
    BackendDescriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
    t.set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims);
    t.set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides);
    t.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
    t.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
    const bool v = is_virtual, bv = by_value;
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv);
    t.finalize();
    return keep(std::move(t));
  }
  Raw virtual_tensor(cudnnDataType_t type, const Dims& dims) { return virtual_tensor(type, dims, packed_strides(dims)); }
  Raw virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, type, dims, strides, true);
  }
  // A float scalar the variant pack hands over by value (a host pointer).
  Raw scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  // y = mode(x[, b][, t]); GEN_INDEX takes `axis`.
  void pointwise(cudnnPointwiseMode_t mode, Raw x, Raw b, Raw y, Raw t = nullptr,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    BackendDescriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set_data_type(CUDNN_ATTR_POINTWISE_MATH_PREC, precision);
    if (axis >= 0) pw.set_int64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    std::vector<Operand> operands = {{CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x}, {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}};
    if (b) operands.push_back({CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b});
    if (t) operands.push_back({CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t});
    operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
              std::move(pw), operands);
  }

  // mode(x[, b]) into a new f32 virtual tensor of `dims`.
  Raw apply(cudnnPointwiseMode_t mode, Raw x, Raw b, const Dims& dims) {
    Raw y = virtual_tensor(CUDNN_DATA_FLOAT, dims);
    pointwise(mode, x, b, y);
    return y;
  }

  // reduce(x) into a new f32 virtual tensor of `dims` (size 1 where x is reduced).
  Raw reduce(cudnnReduceTensorOp_t op, Raw x, const Dims& dims) {
    Raw y = virtual_tensor(CUDNN_DATA_FLOAT, dims);
    reduction(op, x, y);
    return y;
  }

  // y = reduce(x) over the dims where y has size 1.
  void reduction(cudnnReduceTensorOp_t reduce, Raw x, Raw y) {
    BackendDescriptor r(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
    r.set_data_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_DESC, std::move(r),
              {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x}, {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y}});
  }

  // c = a @ b over the last two dims, batched over the first two (f32 accumulation).
  void matmul(Raw a, Raw b, Raw c) {
    BackendDescriptor m(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    m.set_data_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_DESC, std::move(m),
              {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
               {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
               {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c}});
  }

  // y: x's elements under y's dims and strides (the graph's transpose).
  void reshape(Raw x, Raw y) {
    BackendDescriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_raw(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_raw(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize();
    add_op(std::move(op));
  }

  // The finalized operation graph; false when cuDNN refuses it.
  bool finish(BackendDescriptor& graph) {
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()), ops_.data());
    graph.set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, cudnn_handle());
    return graph.try_finalize() == CUDNN_STATUS_SUCCESS;
  }

  std::deque<BackendDescriptor> take_parts() { return std::move(parts_); }

 private:
  struct Operand {
    cudnnBackendAttributeName_t name;
    Raw tensor;
  };

  // An operation of `type` on its finalized descriptor `desc` (set as `desc_name`) and tensors.
  void operation(cudnnBackendDescriptorType_t type, cudnnBackendAttributeName_t desc_name, BackendDescriptor desc,
                 const std::vector<Operand>& operands) {
    desc.finalize();
    BackendDescriptor op(type);
    set_raw(op, desc_name, desc.get());
    for (const Operand& o : operands) set_raw(op, o.name, o.tensor);
    op.finalize();
    keep(std::move(desc));
    add_op(std::move(op));
  }

  static void set_raw(BackendDescriptor& d, cudnnBackendAttributeName_t name, Raw value) {
    d.set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  Raw keep(BackendDescriptor d) {
    parts_.push_back(std::move(d));
    return parts_.back().get();
  }
  void add_op(BackendDescriptor op) { ops_.push_back(keep(std::move(op))); }

  std::deque<BackendDescriptor> parts_;
  std::vector<Raw> ops_;
  int64_t next_virtual_ = kVirtual;
};

using Raw = GraphBuilder::Raw;

// The scaled (and causally masked) scores [b, h, s_q, s_kv] in f32, from the tensors q and kᵀ.
Raw scores(GraphBuilder& g, const CudnnAttentionProblem& p, Raw q, Raw kt, Raw scale) {
  const Dims dims{p.b, p.h, p.s_q, p.s_kv};
  Raw s = g.virtual_tensor(CUDNN_DATA_FLOAT, dims);
  g.matmul(q, kt, s);
  Raw scaled = g.apply(CUDNN_POINTWISE_MUL, s, scale, dims);
  if (!p.causal) return scaled;
  // key j stays for query row i when i >= j (top-left aligned, Ember's causal)
  Raw row = g.virtual_tensor(CUDNN_DATA_INT32, dims), col = g.virtual_tensor(CUDNN_DATA_INT32, dims);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, row, nullptr, CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, col, nullptr, CUDNN_DATA_INT32, 3);
  Raw seen = g.virtual_tensor(CUDNN_DATA_BOOLEAN, dims);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, seen, nullptr, CUDNN_DATA_BOOLEAN);
  Raw masked = g.virtual_tensor(CUDNN_DATA_FLOAT, dims);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, g.scalar(kLowest), masked, seen);
  return masked;
}

// Q [b, h, s_q, d], K seen as Kᵀ [b, h, d, s_kv].
Raw q_tensor(GraphBuilder& g, const CudnnAttentionProblem& p, cudnnDataType_t io) {
  return g.tensor(kQ, io, {p.b, p.h, p.s_q, p.d}, strides_of(p.q));
}
Raw kt_tensor(GraphBuilder& g, const CudnnAttentionProblem& p, cudnnDataType_t io) {
  return g.tensor(kK, io, {p.b, p.h, p.d, p.s_kv}, transposed_strides_of(p.k));
}
Raw stats_tensor(GraphBuilder& g, const CudnnAttentionProblem& p) {
  return g.tensor(kStats, CUDNN_DATA_FLOAT, {p.b, p.h, p.s_q, 1}, {p.h * p.s_q, p.s_q, 1, 1});
}

void forward_graph(GraphBuilder& g, const CudnnAttentionProblem& p, cudnnDataType_t io) {
  const Dims rows{p.b, p.h, p.s_q, 1}, full{p.b, p.h, p.s_q, p.s_kv};
  Raw q = q_tensor(g, p, io), kt = kt_tensor(g, p, io);
  Raw v = g.tensor(kV, io, {p.b, p.h, p.s_kv, p.d}, strides_of(p.v));
  Raw o = g.tensor(kO, io, {p.b, p.h, p.s_q, p.d}, strides_of(p.o));
  Raw s = scores(g, p, q, kt, g.scalar(kScale));
  // softmax with its statistics: Stats = max + log(sum of exp(s - max))
  Raw max = g.reduce(CUDNN_REDUCE_TENSOR_MAX, s, rows);
  Raw e = g.apply(CUDNN_POINTWISE_EXP, g.apply(CUDNN_POINTWISE_SUB, s, max, full), nullptr, full);
  Raw sum = g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, rows);
  g.pointwise(CUDNN_POINTWISE_ADD, max, g.apply(CUDNN_POINTWISE_LOG, sum, nullptr, rows), stats_tensor(g, p));
  // the second product takes the probabilities in the I/O type
  Raw probs = g.virtual_tensor(io, full);
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, probs);
  g.matmul(probs, v, o);
}

void backward_graph(GraphBuilder& g, const CudnnAttentionProblem& p, cudnnDataType_t io) {
  const Dims rows{p.b, p.h, p.s_q, 1}, full{p.b, p.h, p.s_q, p.s_kv}, full_t{p.b, p.h, p.s_kv, p.s_q};
  const Dims full_t_strides{p.h * p.s_q * p.s_kv, p.s_q * p.s_kv, 1, p.s_kv};
  Raw q = q_tensor(g, p, io), kt = kt_tensor(g, p, io);
  Raw vt = g.tensor(kV, io, {p.b, p.h, p.d, p.s_kv}, transposed_strides_of(p.v));
  Raw o = g.tensor(kO, io, {p.b, p.h, p.s_q, p.d}, strides_of(p.o));
  Raw d_o = g.tensor(kDO, io, {p.b, p.h, p.s_q, p.d}, strides_of(p.d_o));
  Raw dq = g.tensor(kDQ, io, {p.b, p.h, p.s_q, p.d}, strides_of(p.dq));
  Raw dk = g.tensor(kDK, io, {p.b, p.h, p.s_kv, p.d}, strides_of(p.dk));
  Raw dv = g.tensor(kDV, io, {p.b, p.h, p.s_kv, p.d}, strides_of(p.dv));
  Raw stats = stats_tensor(g, p), scale = g.scalar(kScale), one = g.scalar(kOne);
  // δ = Σ_d dO · O (times the inverse dropout scale, 1 here)
  Raw d_o_o = g.apply(CUDNN_POINTWISE_MUL, d_o, o, {p.b, p.h, p.s_q, p.d});
  Raw delta = g.apply(CUDNN_POINTWISE_MUL, g.reduce(CUDNN_REDUCE_TENSOR_ADD, d_o_o, rows), one, rows);
  // P = exp(S - Stats); dV = Pᵀ dO
  Raw s = scores(g, p, q, kt, scale);
  Raw probs = g.apply(CUDNN_POINTWISE_EXP, g.apply(CUDNN_POINTWISE_SUB, s, stats, full), nullptr, full);
  Raw probs_t = g.virtual_tensor(io, full_t, full_t_strides);
  g.reshape(probs, probs_t);
  g.matmul(probs_t, d_o, dv);
  // dS = P (dO Vᵀ · 1 - δ) · scale (the 1 stands for the dropout mask)
  Raw dp = g.virtual_tensor(CUDNN_DATA_FLOAT, full);
  g.matmul(d_o, vt, dp);
  Raw dp_centred = g.apply(CUDNN_POINTWISE_SUB, g.apply(CUDNN_POINTWISE_MUL, dp, one, full), delta, full);
  Raw ds = g.apply(CUDNN_POINTWISE_MUL, g.apply(CUDNN_POINTWISE_MUL, dp_centred, probs, full), scale, full);
  // dK = dSᵀ Q; dQ = dS K (K read back from Kᵀ through a reshape)
  Raw ds_t = g.virtual_tensor(io, full_t, full_t_strides);
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, dk);
  Raw k = g.virtual_tensor(io, {p.b, p.h, p.s_kv, p.d}, strides_of(p.k));
  g.reshape(kt, k);
  g.matmul(ds, k, dq);
}

// Every descriptor a plan refers to, kept alive as long as the plan.
struct Plan {
  std::deque<BackendDescriptor> parts;
  BackendDescriptor graph{CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR};
  BackendDescriptor plan{CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR};
  int64_t workspace = 0;
};

bool deterministic(const BackendDescriptor& config) {
  BackendDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  config.get(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  const int64_t n =
      engine.get(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, notes);
  for (int64_t i = 0; i < std::min<int64_t>(n, CUDNN_NUMERICAL_NOTE_TYPE_COUNT); ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  return true;
}

// The plan of the heuristics' first deterministic configuration that finalizes, or null.
std::unique_ptr<Plan> build_plan(const CudnnAttentionProblem& p, Pass pass) {
  try {
    const cudnnDataType_t io = cudnn_data_type(p.dtype, "scaled_dot_product_attention");
    GraphBuilder g;
    if (pass == Pass::Forward)
      forward_graph(g, p, io);
    else
      backward_graph(g, p, io);
    auto plan = std::make_unique<Plan>();
    if (!g.finish(plan->graph)) return nullptr;
    plan->parts = g.take_parts();
    std::vector<BackendDescriptor> configs = engine_configs(plan->graph, CUDNN_HEUR_MODE_A);
    for (BackendDescriptor& c : engine_configs(plan->graph, CUDNN_HEUR_MODE_FALLBACK)) configs.push_back(std::move(c));
    for (const BackendDescriptor& config : configs) {
      if (!deterministic(config)) continue;
      BackendDescriptor candidate(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      candidate.set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, cudnn_handle());
      candidate.set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      if (candidate.try_finalize() != CUDNN_STATUS_SUCCESS) continue;
      candidate.get(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &plan->workspace);
      plan->plan = std::move(candidate);
      return plan;
    }
    return nullptr;
  } catch (const Error&) {
    return nullptr;  // a descriptor cuDNN refused: the problem is outside what it supports
  }
}

std::vector<int64_t> cache_key(const CudnnAttentionProblem& p, Pass pass) {
  std::vector<int64_t> key = {current_device(), int64_t(pass), int64_t(p.dtype), p.b, p.h, p.s_q, p.s_kv, p.d,
                              p.causal ? 1 : 0};
  for (const auto* s : {&p.q, &p.k, &p.v, &p.o}) key.insert(key.end(), s->begin(), s->end());
  if (pass == Pass::Backward)
    for (const auto* s : {&p.d_o, &p.dq, &p.dk, &p.dv}) key.insert(key.end(), s->begin(), s->end());
  return key;
}

// Plans are kept per thread (built on the thread's own handle); null remembers a refusal.
thread_local std::map<std::vector<int64_t>, std::shared_ptr<Plan>> tls_plans;

std::map<std::vector<int64_t>, std::shared_ptr<Plan>>::iterator find_plan(const CudnnAttentionProblem& p, Pass pass) {
  auto key = cache_key(p, pass);
  auto it = tls_plans.find(key);
  if (it == tls_plans.end()) it = tls_plans.emplace(std::move(key), std::shared_ptr<Plan>(build_plan(p, pass))).first;
  return it;
}

// Runs the plan on the variant pack {uids, pointers}; a "not supported" answer forgets the plan
// and declines, any other failure raises.
bool execute(std::map<std::vector<int64_t>, std::shared_ptr<Plan>>::iterator entry, const std::vector<int64_t>& uids,
             std::vector<void*> pointers) {
  const Plan& plan = *entry->second;
  CudnnScratch scratch(plan.workspace);
  void* workspace = scratch.get();
  BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  const cudnnStatus_t status = cudnnBackendExecute(cudnn_handle(), plan.plan.get(), pack.get());
  if (status == CUDNN_STATUS_SUCCESS) return true;
  if (CUDNN_STATUS_CATEGORY(int(status)) == int(CUDNN_STATUS_NOT_SUPPORTED)) {
    entry->second.reset();
    return false;
  }
  raise_cudnn_error(status, "cudnnBackendExecute (attention)", __FILE__, __LINE__);
}

}  // namespace

bool run_cudnn_attention_forward(const CudnnAttentionProblem& p, const CudnnAttentionForwardArgs& a) {
  auto entry = find_plan(p, Pass::Forward);
  if (!entry->second) return false;
  float scale = a.scale, lowest = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> pointers = {const_cast<void*>(a.q), const_cast<void*>(a.k), const_cast<void*>(a.v), a.o, a.stats,
                                 &scale};
  if (p.causal) {  // the masked scores' value exists only in the causal graph
    uids.push_back(kLowest);
    pointers.push_back(&lowest);
  }
  return execute(entry, uids, std::move(pointers));
}

bool run_cudnn_attention_backward(const CudnnAttentionProblem& p, const CudnnAttentionBackwardArgs& a) {
  auto entry = find_plan(p, Pass::Backward);
  if (!entry->second) return false;
  float scale = a.scale, lowest = std::numeric_limits<float>::lowest(), one = 1.0f;
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne};
  std::vector<void*> pointers = {const_cast<void*>(a.q), const_cast<void*>(a.k),   const_cast<void*>(a.v),
                                 const_cast<void*>(a.o), const_cast<void*>(a.d_o), const_cast<float*>(a.stats),
                                 a.dq,                   a.dk,                     a.dv,
                                 &scale,                 &one};
  if (p.causal) {
    uids.push_back(kLowest);
    pointers.push_back(&lowest);
  }
  return execute(entry, uids, std::move(pointers));
}

size_t cudnn_attention_plan_count() { return tls_plans.size(); }

}  // namespace ember::cuda
