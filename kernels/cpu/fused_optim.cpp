// CPU optimizer updates, one pass over each parameter.
#include <cmath>

#include "core/native/fused_optim.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

template <typename P, typename G>
void adam_loop(P* p, const G* g, P* m, P* v, int64_t n, const native::AdamStepArgs& a) {
  using A = acc_t<P>;
  // Coefficients are formed in double and rounded once, as PyTorch does: 1 - 0.999f in float
  // would already be off by 1e-5 relative.
  const A b1 = A(a.beta1), b2 = A(a.beta2), eps = A(a.eps);
  const A one_minus_b1 = A(1.0 - a.beta1), one_minus_b2 = A(1.0 - a.beta2);
  const A step_size = A(a.lr / a.bias_correction1);
  const A bc2_sqrt = A(std::sqrt(a.bias_correction2));
  const A scale = A(a.grad_scale);
  const A decay = A(a.decoupled ? 1.0 - a.lr * a.weight_decay : 1.0);
  const A l2 = A(a.decoupled ? 0.0 : a.weight_decay);
  parallel_for(0, n, 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      A pi = A(p[i]);
      A gi = A(acc_t<G>(g[i])) * scale + l2 * pi;
      A mi = b1 * A(m[i]) + one_minus_b1 * gi;
      A vi = b2 * A(v[i]) + one_minus_b2 * gi * gi;
      pi = pi * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
      p[i] = P(pi);
      m[i] = P(mi);
      v[i] = P(vi);
    }
  });
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

void sgd_cpu(const Tensor& param, const Tensor& grad, const Tensor& buf, const native::SgdStepArgs& a) {
  visit_floating(param.dtype(), "sgd_step", [&](auto ptag) {
    using P = typename decltype(ptag)::type;
    using A = acc_t<P>;
    visit_floating(grad.dtype(), "sgd_step", [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      P* p = param.data_ptr<P>();
      const G* g = grad.data_ptr<G>();
      P* mb = buf.defined() ? buf.data_ptr<P>() : nullptr;
      const A lr = A(a.lr), mom = A(a.momentum), one_minus_damp = A(1.0 - a.dampening), wd = A(a.weight_decay);
      parallel_for(0, param.numel(), 16384, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          A d = A(acc_t<G>(g[i])) + wd * A(p[i]);
          if (mb) {
            const A m = a.first_step ? d : mom * A(mb[i]) + one_minus_damp * d;
            mb[i] = P(m);
            d = a.nesterov ? d + mom * m : m;
          }
          p[i] = P(A(p[i]) - lr * d);
        }
      });
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::adam_step_stub, CPU, &adam_cpu);
EMBER_REGISTER_KERNEL(native::sgd_step_stub, CPU, &sgd_cpu);

}  // namespace ember
