// CUDA optimizer updates, one pass over each parameter: every thread reads param, grad and
// state of its elements once and writes them once. The arithmetic is that of
// kernels/cpu/fused_optim.cpp, operation for operation: coefficients formed in double on the
// host and rounded once to the state's compute type, 16-bit values computed in float. The Adam
// element update lives in fused_optim_adam_update.cuh, shared with the multi-tensor kernel.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/native/fused_optim.h"
#include "kernels/cuda/fused_optim_adam_update.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"
#include "kernels/shared/adam_coefficients.h"

namespace ember {
namespace {

constexpr int kThreads = 256;

template <typename A>
using AdamCoefficients = kernels::AdamCoefficients<A>;

template <typename P, typename G>
__global__ void adam_kernel(P* p, const G* g, P* m, P* v, AdamCoefficients<cuda::device_acc_t<P>> c, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    cuda::adam_update_at(p, g, m, v, i, c);
}

template <typename A>
struct SgdCoefficients {
  A lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, first_step;
};

// mb == nullptr: no momentum.
template <typename P, typename G>
__global__ void sgd_kernel(P* p, const G* g, P* mb, SgdCoefficients<cuda::device_acc_t<P>> c, int64_t n) {
  using A = cuda::device_acc_t<P>;
  using CP = cuda::Acc<P>;
  using CG = cuda::Acc<G>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const A pi = CP::load(p[i]);
    A d = A(CG::load(g[i])) + c.weight_decay * pi;
    if (mb) {
      const A mi = c.first_step ? d : c.momentum * CP::load(mb[i]) + c.one_minus_dampening * d;
      mb[i] = CP::store(mi);
      d = c.nesterov ? d + c.momentum * mi : mi;
    }
    p[i] = CP::store(pi - c.lr * d);
  }
}

using cuda::visit_param_and_grad;

void adam_cuda(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
               const native::AdamStepArgs& args) {
  EMBER_CHECK(m.dtype() == param.dtype() && v.dtype() == param.dtype(), "adam_step: optimizer state dtype ",
              dtype_name(m.dtype()), " differs from parameter dtype ", dtype_name(param.dtype()));
  cuda::DeviceGuard guard(param.device(), "adam_step");
  const int64_t n = param.numel();
  if (n == 0) return;
  visit_param_and_grad(param.dtype(), grad.dtype(), "adam_step", [&](auto ptag, auto gtag) {
    using P = typename decltype(ptag)::type;
    using G = typename decltype(gtag)::type;
    const auto c = kernels::adam_coefficients<cuda::device_acc_t<P>>(args);
    adam_kernel<P, G><<<cuda::grid_for(n, kThreads), kThreads, 0, cuda::current_stream()>>>(
        static_cast<P*>(param.raw_data()), static_cast<const G*>(grad.raw_data()), static_cast<P*>(m.raw_data()),
        static_cast<P*>(v.raw_data()), c, n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void sgd_cuda(const Tensor& param, const Tensor& grad, const Tensor& buf, const native::SgdStepArgs& a) {
  EMBER_CHECK(!buf.defined() || buf.dtype() == param.dtype(), "sgd_step: momentum buffer dtype ",
              dtype_name(buf.dtype()), " differs from parameter dtype ", dtype_name(param.dtype()));
  cuda::DeviceGuard guard(param.device(), "sgd_step");
  const int64_t n = param.numel();
  if (n == 0) return;
  visit_param_and_grad(param.dtype(), grad.dtype(), "sgd_step", [&](auto ptag, auto gtag) {
    using P = typename decltype(ptag)::type;
    using G = typename decltype(gtag)::type;
    using A = cuda::device_acc_t<P>;
    const SgdCoefficients<A> c{A(a.lr), A(a.momentum), A(1.0 - a.dampening), A(a.weight_decay), a.nesterov,
                               a.first_step};
    sgd_kernel<P, G><<<cuda::grid_for(n, kThreads), kThreads, 0, cuda::current_stream()>>>(
        static_cast<P*>(param.raw_data()), static_cast<const G*>(grad.raw_data()),
        buf.defined() ? static_cast<P*>(buf.raw_data()) : nullptr, c, n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::adam_step_stub, CUDA, &adam_cuda);
EMBER_REGISTER_KERNEL(native::sgd_step_stub, CUDA, &sgd_cuda);

}  // namespace ember
