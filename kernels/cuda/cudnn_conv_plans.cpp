#include "kernels/cuda/cudnn_conv_plans.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cublas_handles.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_backend.h"

namespace ember::cuda {
namespace {

// The tensors' ids in the graph and the variant pack.
constexpr int64_t kX = 1, kW = 2, kY = 3;
// A benchmarked candidate needing more scratch than this is skipped.
constexpr int64_t kMaxBenchmarkWorkspace = int64_t(1) << 30;

EnvSwitch benchmark_switch{"EMBER_CUDNN_BENCHMARK"};

const char* pass_name(CudnnConvPass pass) {
  switch (pass) {
    case CudnnConvPass::Forward: return "forward";
    case CudnnConvPass::BackwardData: return "backward (input)";
    case CudnnConvPass::BackwardFilter: return "backward (weight)";
  }
  return "?";
}

std::string describe(const CudnnConvProblem& p) {
  auto list = [](const auto& a) {
    std::string s = "[";
    for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
    return s + "]";
  };
  return std::string("conv2d ") + pass_name(p.pass) + " on cuDNN: x " + list(p.x_dims) + " w " + list(p.w_dims) +
         " y " + list(p.y_dims) + " stride " + list(p.stride) + " padding " + list(p.pre_padding) + "/" +
         list(p.post_padding) + " dilation " + list(p.dilation) + " " + dtype_name(p.dtype);
}

std::array<int64_t, 4> packed_strides(const std::array<int64_t, 4>& dims) {
  return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
}

BackendDescriptor tensor(int64_t uid, const std::array<int64_t, 4>& dims, const std::array<int64_t, 4>& strides,
                         const CudnnConvProblem& p) {
  BackendDescriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, cudnn_data_type(p.dtype, "conv2d"));
  t.set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, {dims.begin(), dims.end()});
  t.set_int64s(CUDNN_ATTR_TENSOR_STRIDES, {strides.begin(), strides.end()});
  t.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, p.alignment);
  t.finalize();
  return t;
}

BackendDescriptor convolution(const CudnnConvProblem& p) {
  BackendDescriptor c(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  c.set_data_type(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, p.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  c.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  c.set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2);
  c.set_int64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {p.pre_padding[0], p.pre_padding[1]});
  c.set_int64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {p.post_padding[0], p.post_padding[1]});
  c.set_int64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, {p.dilation[0], p.dilation[1]});
  c.set_int64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {p.stride[0], p.stride[1]});
  c.finalize();
  return c;
}

// Every descriptor a plan refers to, kept alive as long as the plan.
struct Plan {
  std::vector<BackendDescriptor> parts;  // x, w, y, convolution, operation, graph
  BackendDescriptor plan{CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR};
  int64_t workspace = 0;
};

// The backend's names for one pass's operation and its attributes.
struct PassAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t alpha, beta, conv, x, w, y;
};

PassAttributes attributes_of(CudnnConvPass pass) {
  switch (pass) {
    case CudnnConvPass::Forward:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y};
    case CudnnConvPass::BackwardData:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY};
    case CudnnConvPass::BackwardFilter:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY};
  }
  EMBER_FAIL("conv2d on cuDNN: unknown pass");
}

// The pass's operation on parts {x, w, y, convolution}: output = 1 * conv + 0 * output.
BackendDescriptor operation(const CudnnConvProblem& p, const std::vector<BackendDescriptor>& parts) {
  const PassAttributes names = attributes_of(p.pass);
  const double alpha64 = 1.0, beta64 = 0.0;
  const float alpha32 = 1.0f, beta32 = 0.0f;
  const bool f64 = p.dtype == DType::f64;  // f64 convolutions take double scalars, the rest float
  const cudnnBackendAttributeType_t scalar = f64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  BackendDescriptor op(names.type);
  op.set(names.alpha, scalar, 1, f64 ? static_cast<const void*>(&alpha64) : &alpha32);
  op.set(names.beta, scalar, 1, f64 ? static_cast<const void*>(&beta64) : &beta32);
  op.set_descriptor(names.conv, parts[3]);
  op.set_descriptor(names.x, parts[0]);
  op.set_descriptor(names.w, parts[1]);
  op.set_descriptor(names.y, parts[2]);
  op.finalize();
  return op;
}

// The engine's global index and whether its numerical notes fit Ember's rules (see the header).
struct EngineFacts {
  int64_t index = -1;
  bool acceptable = false;
};

EngineFacts engine_facts(const BackendDescriptor& config, DType dtype) {
  BackendDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  config.get(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  EngineFacts facts;
  engine.get(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &facts.index);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  const int64_t n = engine.get(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, notes);
  const bool full_precision = dtype == DType::f32 || dtype == DType::f64;
  facts.acceptable = true;
  for (int64_t i = 0; i < std::min<int64_t>(n, CUDNN_NUMERICAL_NOTE_TYPE_COUNT); ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) facts.acceptable = false;
    if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && dtype == DType::f32 && !allow_tf32()) facts.acceptable = false;
    if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS && full_precision) facts.acceptable = false;
  }
  return facts;
}

void execute(const BackendDescriptor& plan, void* x, void* w, void* y, void* workspace) {
  const int64_t uids[3] = {kX, kW, kY};
  void* pointers[3] = {x, w, y};
  BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  EMBER_CUDNN_CHECK(cudnnBackendExecute(cudnn_handle(), plan.get(), pack.get()));
}

// Milliseconds one execution of `plan` takes on the current stream (after one untimed run).
float time_plan(const Plan& plan, void* x, void* w, void* y) {
  CudnnScratch scratch(plan.workspace);
  execute(plan.plan, x, w, y, scratch.get());
  cudaEvent_t start = nullptr, stop = nullptr;
  EMBER_CUDA_CHECK(cudaEventCreate(&start));
  EMBER_CUDA_CHECK(cudaEventCreate(&stop));
  EMBER_CUDA_CHECK(cudaEventRecord(start, current_stream()));
  execute(plan.plan, x, w, y, scratch.get());
  EMBER_CUDA_CHECK(cudaEventRecord(stop, current_stream()));
  EMBER_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

// The plan for a problem: the heuristics' first acceptable configuration, or the fastest of
// the first kBenchmarkCandidates when benchmarking.
std::unique_ptr<Plan> choose_plan(const CudnnConvProblem& p, void* x, void* w, void* y) {
  std::vector<BackendDescriptor> parts;
  parts.push_back(tensor(kX, p.x_dims, p.x_strides, p));
  parts.push_back(tensor(kW, p.w_dims, packed_strides(p.w_dims), p));
  parts.push_back(tensor(kY, p.y_dims, packed_strides(p.y_dims), p));
  parts.push_back(convolution(p));
  parts.push_back(operation(p, parts));
  BackendDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendDescriptor_t op = parts.back().get();
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
  graph.set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, cudnn_handle());
  graph.finalize();

  std::vector<BackendDescriptor> configs = engine_configs(graph, CUDNN_HEUR_MODE_A);
  for (BackendDescriptor& c : engine_configs(graph, CUDNN_HEUR_MODE_FALLBACK)) configs.push_back(std::move(c));

  const bool benchmark = cudnn_benchmark();
  std::vector<std::unique_ptr<Plan>> candidates;
  std::vector<int64_t> tried_engines;
  for (const BackendDescriptor& config : configs) {
    const EngineFacts facts = engine_facts(config, p.dtype);
    if (!facts.acceptable ||
        std::find(tried_engines.begin(), tried_engines.end(), facts.index) != tried_engines.end())
      continue;
    tried_engines.push_back(facts.index);
    auto plan = std::make_unique<Plan>();
    plan->plan.set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, cudnn_handle());
    plan->plan.set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
    if (plan->plan.try_finalize() != CUDNN_STATUS_SUCCESS) continue;
    plan->plan.get(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &plan->workspace);
    if (benchmark && plan->workspace > kMaxBenchmarkWorkspace) continue;
    candidates.push_back(std::move(plan));
    if (!benchmark || int(candidates.size()) == kBenchmarkCandidates) break;
  }
  EMBER_CHECK(!candidates.empty(), describe(p), ": no cuDNN engine supports this convolution (", configs.size(),
              " configurations offered, ", tried_engines.size(), " deterministic and at full precision)");
  size_t best = 0;
  if (candidates.size() > 1) {
    float best_ms = time_plan(*candidates[0], x, w, y);
    for (size_t i = 1; i < candidates.size(); ++i) {
      const float ms = time_plan(*candidates[i], x, w, y);
      if (ms < best_ms) best_ms = ms, best = i;
    }
  }
  std::unique_ptr<Plan> chosen = std::move(candidates[best]);
  chosen->parts = std::move(parts);
  chosen->parts.push_back(std::move(graph));
  return chosen;
}

std::vector<int64_t> cache_key(const CudnnConvProblem& p) {
  std::vector<int64_t> key = {current_device(), int64_t(p.pass), int64_t(p.dtype), p.alignment,
                              allow_tf32() ? 1 : 0, cudnn_benchmark() ? 1 : 0};
  for (const auto* a : {&p.x_dims, &p.x_strides, &p.w_dims, &p.y_dims}) key.insert(key.end(), a->begin(), a->end());
  for (const auto* a : {&p.stride, &p.pre_padding, &p.post_padding, &p.dilation})
    key.insert(key.end(), a->begin(), a->end());
  return key;
}

// Plans are kept per thread: a plan is built on the thread's own handle.
thread_local std::map<std::vector<int64_t>, std::unique_ptr<Plan>> tls_plans;

}  // namespace

void run_cudnn_conv(const CudnnConvProblem& problem, void* x, void* w, void* y) {
  auto key = cache_key(problem);
  auto it = tls_plans.find(key);
  if (it == tls_plans.end()) it = tls_plans.emplace(std::move(key), choose_plan(problem, x, w, y)).first;
  const Plan& plan = *it->second;
  CudnnScratch scratch(plan.workspace);
  execute(plan.plan, x, w, y, scratch.get());
}

void set_cudnn_benchmark(bool on) { benchmark_switch.set(on); }

bool cudnn_benchmark() { return benchmark_switch.get(); }

size_t cudnn_conv_plan_count() { return tls_plans.size(); }

}  // namespace ember::cuda
