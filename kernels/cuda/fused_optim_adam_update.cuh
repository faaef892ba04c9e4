// The per-element Adam/AdamW update shared by the per-tensor kernel (fused_optim.cu) and the
// multi-tensor kernel (fused_optim_multi.cu): both call this one function, so a parameter gets
// bit-identical results whichever path updates it. The operations are those of
// kernels/cpu/fused_optim.cpp, in the same order, with coefficients from
// kernels/shared/adam_coefficients.h.
#pragma once
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/shared/adam_coefficients.h"

namespace ember::cuda {

// New (param, exp_avg, exp_avg_sq) of one element, all in the compute type A.
template <typename A>
struct AdamElement {
  A p, m, v;
};

// p, m, v: current values in A; g: the gradient element converted to A.
template <typename A>
__device__ __forceinline__ AdamElement<A> adam_update(A p, A g, A m, A v, const kernels::AdamCoefficients<A>& c) {
  const A gi = g * c.scale + c.l2 * p;
  const A mi = c.b1 * m + c.one_minus_b1 * gi;
  const A vi = c.b2 * v + c.one_minus_b2 * gi * gi;
  const A pi = p * c.decay - c.step_size * mi / (d_sqrt(vi) / c.bc2_sqrt + c.eps);
  return {pi, mi, vi};
}

// Element i of (p, g, m, v) updated in place.
template <typename P, typename G>
__device__ __forceinline__ void adam_update_at(P* p, const G* g, P* m, P* v, int64_t i,
                                               const kernels::AdamCoefficients<device_acc_t<P>>& c) {
  using A = device_acc_t<P>;
  using CP = Acc<P>;
  using CG = Acc<G>;
  const AdamElement<A> r = adam_update<A>(CP::load(p[i]), A(CG::load(g[i])), CP::load(m[i]), CP::load(v[i]), c);
  p[i] = CP::store(r.p);
  m[i] = CP::store(r.m);
  v[i] = CP::store(r.v);
}

// Calls fn(type_tag<P>, type_tag<G>) for the floating dtypes of param and grad; integer dtypes
// raise an error naming op.
template <typename Fn>
void visit_param_and_grad(DType param, DType grad, const char* op, const Fn& fn) {
  visit_device_type(param, op, [&](auto ptag) {
    using P = typename decltype(ptag)::type;
    if constexpr (std::is_integral_v<P>) {
      EMBER_FAIL(op, ": expected a floating-point parameter, got ", dtype_name(param));
    } else {
      visit_device_type(grad, op, [&](auto gtag) {
        using G = typename decltype(gtag)::type;
        if constexpr (std::is_integral_v<G>) {
          EMBER_FAIL(op, ": expected a floating-point gradient, got ", dtype_name(grad));
        } else {
          fn(ptag, gtag);
        }
      });
    }
  });
}

}  // namespace ember::cuda
