// CPU optimizer updates, one pass over each parameter (the element updates are in
// optim_updates.h; the f32 Adam/AdamW update runs 8 lanes at a time).
#include "core/native/fused_optim.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/optim_updates.h"

namespace ember {
namespace {

template <typename P, typename G>
void adam_loop(P* p, const G* g, P* m, P* v, int64_t n, const native::AdamStepArgs& a) {
  const auto c = kernels::adam_coefficients<acc_t<P>>(a);
  parallel_for(0, n, 16384, [&](int64_t b, int64_t e) { cpu::adam_range(p, g, m, v, b, e, c); });
}

void adam_cpu(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
              const native::AdamStepArgs& args) {
  EMBER_CHECK(m.dtype() == param.dtype() && v.dtype() == param.dtype(), "adam_step: optimizer state dtype ",
              dtype_name(m.dtype()), " differs from parameter dtype ", dtype_name(param.dtype()));
  visit_floating(param.dtype(), "adam_step", [&](auto ptag) {
    using P = typename decltype(ptag)::type;
    visit_floating(grad.dtype(), "adam_step", [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      adam_loop<P, G>(param.data_ptr<P>(), grad.data_ptr<G>(), m.data_ptr<P>(), v.data_ptr<P>(), param.numel(), args);
    });
  });
}

// The CPU gains nothing from batching launches: each parameter takes the per-tensor kernel.
void adam_multi_cpu(const std::vector<native::AdamTensors>& tensors, const native::AdamStepArgs& args) {
  for (const native::AdamTensors& t : tensors) adam_cpu(t.param, t.grad, t.exp_avg, t.exp_avg_sq, args);
}

void sgd_cpu(const Tensor& param, const Tensor& grad, const Tensor& buf, const native::SgdStepArgs& a) {
  visit_floating(param.dtype(), "sgd_step", [&](auto ptag) {
    using P = typename decltype(ptag)::type;
    visit_floating(grad.dtype(), "sgd_step", [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      P* p = param.data_ptr<P>();
      const G* g = grad.data_ptr<G>();
      P* mb = buf.defined() ? buf.data_ptr<P>() : nullptr;
      const auto c = cpu::sgd_coefficients<acc_t<P>>(a);
      parallel_for(0, param.numel(), 16384, [&](int64_t b, int64_t e) { cpu::sgd_range(p, g, mb, b, e, c); });
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::adam_step_stub, CPU, &adam_cpu);
EMBER_REGISTER_KERNEL(native::adam_multi_step_stub, CPU, &adam_multi_cpu);
EMBER_REGISTER_KERNEL(native::sgd_step_stub, CPU, &sgd_cpu);

}  // namespace ember
