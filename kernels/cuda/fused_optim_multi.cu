// Multi-tensor Adam/AdamW step on CUDA: the whole parameter list in a few launches instead of
// one per parameter (BERT-base has ~200 parameters, and for the small ones a launch costs more
// than the math). Each tensor is cut into chunks of kChunk elements and every block updates
// one chunk. A launch carries its tensors' pointers and sizes and a block -> (tensor, chunk)
// table in one struct passed by value, sized to stay under the 4 KiB kernel-parameter limit of
// older architectures: up to kMaxTensors tensors and kMaxBlocks blocks per launch, a tensor
// with more chunks than fit carrying over into the next launch. Blocks whose four arrays are
// aligned move kVec elements per load and store. Every element goes through the same
// cuda::adam_update as the per-tensor kernel (fused_optim.cu), so results are bit-identical.
#include <cstdint>

#include "core/native/fused_optim.h"
#include "kernels/cuda/fused_optim_adam_update.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"  // EMBER_CUDA_CHECK_LAUNCH
#include "kernels/shared/adam_coefficients.h"

namespace ember {
namespace {

constexpr int kThreads = 512;
constexpr int kVec = 4;             // elements per vector access
constexpr int64_t kChunk = 65536;   // elements per block: 32 vector steps of a 512-thread block
constexpr int kMaxTensors = 24;     // tensors per launch
constexpr int kMaxBlocks = 320;     // blocks (chunks) per launch
static_assert(kChunk % kVec == 0, "chunks start on a vector boundary");

template <typename A>
using AdamCoefficients = kernels::AdamCoefficients<A>;

// What one launch updates: tensors in slots [0, number of slots used), and for each block
// the slot of its tensor and the index of its chunk within that tensor.
template <typename P, typename G>
struct LaunchTable {
  P* p[kMaxTensors];
  const G* g[kMaxTensors];
  P* m[kMaxTensors];
  P* v[kMaxTensors];
  int64_t n[kMaxTensors];
  int32_t chunk[kMaxBlocks];
  uint8_t slot[kMaxBlocks];
};
static_assert(sizeof(LaunchTable<double, double>) + sizeof(AdamCoefficients<double>) <= 3840,
              "kernel parameters must stay under 4 KiB");
static_assert(kMaxTensors <= 256, "slots are stored in one byte");

template <typename T>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <typename T>
__device__ __forceinline__ bool pack_aligned(const T* x) {
  return reinterpret_cast<uintptr_t>(x) % sizeof(Pack<T>) == 0;
}

template <typename P, typename G>
__global__ void __launch_bounds__(kThreads)
    adam_multi_kernel(const LaunchTable<P, G> table, const AdamCoefficients<cuda::device_acc_t<P>> c) {
  using A = cuda::device_acc_t<P>;
  using CP = cuda::Acc<P>;
  using CG = cuda::Acc<G>;
  const int s = table.slot[blockIdx.x];
  P* const p = table.p[s];
  const G* const g = table.g[s];
  P* const m = table.m[s];
  P* const v = table.v[s];
  const int64_t n = table.n[s];
  const int64_t begin = int64_t(table.chunk[blockIdx.x]) * kChunk;
  const int64_t end = n - begin < kChunk ? n : begin + kChunk;
  int64_t tail = begin;  // first element the scalar loop below updates
  if (pack_aligned(p) && pack_aligned(g) && pack_aligned(m) && pack_aligned(v)) {
    // begin is a multiple of kVec, so pack k of the chunk starts at element begin + k * kVec.
    const int64_t packs = (end - begin) / kVec;
    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      const int64_t i = begin + k * kVec;
      Pack<P> pp = *reinterpret_cast<const Pack<P>*>(p + i);
      const Pack<G> pg = *reinterpret_cast<const Pack<G>*>(g + i);
      Pack<P> pm = *reinterpret_cast<const Pack<P>*>(m + i);
      Pack<P> pv = *reinterpret_cast<const Pack<P>*>(v + i);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const cuda::AdamElement<A> r =
            cuda::adam_update<A>(CP::load(pp.v[j]), A(CG::load(pg.v[j])), CP::load(pm.v[j]), CP::load(pv.v[j]), c);
        pp.v[j] = CP::store(r.p);
        pm.v[j] = CP::store(r.m);
        pv.v[j] = CP::store(r.v);
      }
      *reinterpret_cast<Pack<P>*>(p + i) = pp;
      *reinterpret_cast<Pack<P>*>(m + i) = pm;
      *reinterpret_cast<Pack<P>*>(v + i) = pv;
    }
    tail = begin + packs * kVec;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) cuda::adam_update_at(p, g, m, v, i, c);
}

// Fills launch tables chunk by chunk and launches each when its blocks or slots run out.
template <typename P, typename G>
void launch_all(const std::vector<native::AdamTensors>& tensors, const AdamCoefficients<cuda::device_acc_t<P>>& c) {
  const cudaStream_t stream = cuda::current_stream();
  LaunchTable<P, G> table{};
  int slots = 0, blocks = 0;
  const auto launch = [&] {
    if (blocks > 0) {
      adam_multi_kernel<P, G><<<blocks, kThreads, 0, stream>>>(table, c);
      EMBER_CUDA_CHECK_LAUNCH();
    }
    slots = 0;
    blocks = 0;
  };
  for (const native::AdamTensors& t : tensors) {
    const int64_t n = t.param.numel();
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    EMBER_CHECK(chunks <= INT32_MAX, "adam_multi_step: a parameter of ", n, " elements is too large");
    int slot = -1;  // the tensor's slot in the current table; -1: not in it yet
    for (int64_t k = 0; k < chunks; ++k) {
      if (blocks == kMaxBlocks) {
        launch();
        slot = -1;
      }
      if (slot < 0) {
        if (slots == kMaxTensors) launch();
        slot = slots++;
        table.p[slot] = static_cast<P*>(t.param.raw_data());
        table.g[slot] = static_cast<const G*>(t.grad.raw_data());
        table.m[slot] = static_cast<P*>(t.exp_avg.raw_data());
        table.v[slot] = static_cast<P*>(t.exp_avg_sq.raw_data());
        table.n[slot] = n;
      }
      table.slot[blocks] = uint8_t(slot);
      table.chunk[blocks] = int32_t(k);
      ++blocks;
    }
  }
  launch();
}

// native::adam_multi_step has checked devices, shapes and dtypes and dropped empty tensors.
void adam_multi_cuda(const std::vector<native::AdamTensors>& tensors, const native::AdamStepArgs& args) {
  if (tensors.empty()) return;
  const Tensor& first = tensors[0].param;
  cuda::DeviceGuard guard(first.device(), "adam_multi_step");
  cuda::visit_param_and_grad(first.dtype(), tensors[0].grad.dtype(), "adam_multi_step", [&](auto ptag, auto gtag) {
    using P = typename decltype(ptag)::type;
    using G = typename decltype(gtag)::type;
    launch_all<P, G>(tensors, kernels::adam_coefficients<cuda::device_acc_t<P>>(args));
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::adam_multi_step_stub, CUDA, &adam_multi_cuda);

}  // namespace ember
