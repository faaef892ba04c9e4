// CPU optimizer updates, one pass over each parameter. The f32 Adam/AdamW update runs 8 lanes
// at a time (the scalar loop cannot vectorise: sqrt there may set errno).
#include <bit>
#include <cmath>
#include <type_traits>

#include "core/native/fused_optim.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/vec_half.h"
#include "kernels/shared/adam_coefficients.h"

namespace ember {
namespace {

template <typename A>
using AdamCoefficients = kernels::AdamCoefficients<A>;

// The update of one element, in A = acc_t<P>. The vector loop below computes the same
// operations in the same order, lane by lane, so every element rounds identically.
template <typename P, typename G>
void adam_scalar(P* p, const G* g, P* m, P* v, int64_t b, int64_t e, const AdamCoefficients<acc_t<P>>& c) {
  using A = acc_t<P>;
  for (int64_t i = b; i < e; ++i) {
    A pi = A(p[i]);
    const A gi = A(acc_t<G>(g[i])) * c.scale + c.l2 * pi;
    const A mi = c.b1 * A(m[i]) + c.one_minus_b1 * gi;
    const A vi = c.b2 * A(v[i]) + c.one_minus_b2 * gi * gi;
    pi = pi * c.decay - c.step_size * mi / (std::sqrt(vi) / c.bc2_sqrt + c.eps);
    p[i] = P(pi);
    m[i] = P(mi);
    v[i] = P(vi);
  }
}

#if defined(__AVX2__)
// f32 state, any floating gradient: 8 elements per step, one read and one write of each array.
template <typename G>
void adam_f32_vector(float* p, const G* g, float* m, float* v, int64_t b, int64_t e,
                     const AdamCoefficients<float>& c) {
  using namespace cpu::vec8;
  int64_t i = b;
  for (; i + kLanes <= e; i += kLanes) {
    f8 pi = load8(p + i);
    const f8 gi = load8(g + i) * c.scale + c.l2 * pi;
    const f8 mi = c.b1 * load8(m + i) + c.one_minus_b1 * gi;
    const f8 vi = c.b2 * load8(v + i) + c.one_minus_b2 * gi * gi;
    const f8 root = std::bit_cast<f8>(_mm256_sqrt_ps(std::bit_cast<__m256>(vi)));
    pi = pi * c.decay - c.step_size * mi / (root / c.bc2_sqrt + c.eps);
    store8(p + i, pi);
    store8(m + i, mi);
    store8(v + i, vi);
  }
  adam_scalar(p, g, m, v, i, e, c);
}
#endif

template <typename P, typename G>
void adam_loop(P* p, const G* g, P* m, P* v, int64_t n, const native::AdamStepArgs& a) {
  using A = acc_t<P>;
  const auto c = kernels::adam_coefficients<A>(a);
  parallel_for(0, n, 16384, [&](int64_t b, int64_t e) {
#if defined(__AVX2__)
    if constexpr (std::is_same_v<P, float> && !std::is_same_v<G, double>) {
      adam_f32_vector(p, g, m, v, b, e, c);
      return;
    }
#endif
    adam_scalar(p, g, m, v, b, e, c);
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

// The CPU gains nothing from batching launches: each parameter takes the per-tensor kernel.
void adam_multi_cpu(const std::vector<native::AdamTensors>& tensors, const native::AdamStepArgs& args) {
  for (const native::AdamTensors& t : tensors) adam_cpu(t.param, t.grad, t.exp_avg, t.exp_avg_sq, args);
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
EMBER_REGISTER_KERNEL(native::adam_multi_step_stub, CPU, &adam_multi_cpu);
EMBER_REGISTER_KERNEL(native::sgd_step_stub, CPU, &sgd_cpu);

}  // namespace ember
