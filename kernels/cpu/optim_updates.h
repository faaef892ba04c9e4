// The per-element Adam/AdamW and SGD updates over a range of one parameter, shared by the dense
// steps (fused_optim.cpp) and the row-sparse ones (fused_optim_rows.cpp) so that both round
// every element identically. Each element's result depends on nothing but its own inputs, so
// any split of a parameter into ranges gives the same bits.
#pragma once
#include <bit>
#include <cmath>
#include <type_traits>

#include "core/native/fused_optim.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/vec_half.h"
#include "kernels/shared/adam_coefficients.h"

namespace ember::cpu {

template <typename A>
using AdamCoefficients = kernels::AdamCoefficients<A>;

// The update of one element, in A = acc_t<P> (f64 parameters, or f32 ones without AVX2 or with
// f64 gradients; the scalar loop cannot vectorise: sqrt there may set errno).
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
// One group of 8 f32 elements.
template <typename G>
[[gnu::always_inline]] inline void adam_f32_lanes(float* p, const G* g, float* m, float* v,
                                                  const AdamCoefficients<float>& c) {
  using namespace vec8;
  f8 pi = load8(p);
  const f8 gi = load8(g) * c.scale + c.l2 * pi;
  const f8 mi = c.b1 * load8(m) + c.one_minus_b1 * gi;
  const f8 vi = c.b2 * load8(v) + c.one_minus_b2 * gi * gi;
  const f8 root = std::bit_cast<f8>(_mm256_sqrt_ps(std::bit_cast<__m256>(vi)));
  pi = pi * c.decay - c.step_size * mi / (root / c.bc2_sqrt + c.eps);
  store8(p, pi);
  store8(m, mi);
  store8(v, vi);
}

// f32 state, any floating gradient: 8 elements per step, one read and one write of each array.
// A last partial group goes through the same lanes, padded with zeros: the compiler may fuse
// multiplies and adds differently in scalar code, and then an element's bits would depend on
// where a range starts (the row-sparse step must match the dense one).
template <typename G>
void adam_f32_vector(float* p, const G* g, float* m, float* v, int64_t b, int64_t e,
                     const AdamCoefficients<float>& c) {
  constexpr int64_t kLanes = vec8::kLanes;
  int64_t i = b;
  for (; i + kLanes <= e; i += kLanes) adam_f32_lanes(p + i, g + i, m + i, v + i, c);
  if (i == e) return;
  float pp[kLanes] = {}, mm[kLanes] = {}, vv[kLanes] = {};
  G gg[kLanes];
  const int64_t rest = e - i;
  for (int64_t k = 0; k < kLanes; ++k) {
    gg[k] = k < rest ? g[i + k] : G(0.0f);
    if (k < rest) {
      pp[k] = p[i + k];
      mm[k] = m[i + k];
      vv[k] = v[i + k];
    }
  }
  adam_f32_lanes(pp, gg, mm, vv, c);
  for (int64_t k = 0; k < rest; ++k) {
    p[i + k] = pp[k];
    m[i + k] = mm[k];
    v[i + k] = vv[k];
  }
}
#endif

// Elements [b, e): the vector loop where it applies, else the scalar one.
template <typename P, typename G>
void adam_range(P* p, const G* g, P* m, P* v, int64_t b, int64_t e, const AdamCoefficients<acc_t<P>>& c) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<P, float> && !std::is_same_v<G, double>) {
    adam_f32_vector(p, g, m, v, b, e, c);
    return;
  }
#endif
  adam_scalar(p, g, m, v, b, e, c);
}

// SGD's constants in A = acc_t<P>.
template <typename A>
struct SgdCoefficients {
  A lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, first_step;
};

template <typename A>
SgdCoefficients<A> sgd_coefficients(const native::SgdStepArgs& a) {
  return {A(a.lr), A(a.momentum), A(1.0 - a.dampening), A(a.weight_decay), a.nesterov, a.first_step};
}

// Elements [b, e); mb (the momentum buffer) is null without momentum.
template <typename P, typename G>
void sgd_range(P* p, const G* g, P* mb, int64_t b, int64_t e, const SgdCoefficients<acc_t<P>>& c) {
  using A = acc_t<P>;
  for (int64_t i = b; i < e; ++i) {
    A d = A(acc_t<G>(g[i])) + c.weight_decay * A(p[i]);
    if (mb) {
      const A m = c.first_step ? d : c.momentum * A(mb[i]) + c.one_minus_dampening * d;
      mb[i] = P(m);
      d = c.nesterov ? d + c.momentum * m : m;
    }
    p[i] = P(A(p[i]) - c.lr * d);
  }
}

}  // namespace ember::cpu
