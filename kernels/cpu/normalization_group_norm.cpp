// CPU group norm, forward and backward, threaded over (sample, group) rows: each row is the
// contiguous c / groups * s elements of one group of one sample.
//
// Forward: one pass for the row's sum and sum of squares (in double lanes), one pass writing
// y = x * scale + shift per channel. Backward: one pass for each channel's sum(dy) and
// sum(dy * x) in the row, from which the row's two means of the gradient formula follow, and
// one pass writing dx = dy * a + x * b + d per channel. dweight and dbias are then summed over
// the samples in order from the per-(sample, channel) sums, so they do not depend on the thread
// count.
#include <algorithm>
#include <cmath>

#include "core/native/normalization.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/normalization_lanes.h"
#include "kernels/cpu/scratch.h"

namespace ember {
namespace {

using native::ChannelGeometry;
namespace nl = cpu::norm_lanes;

constexpr int64_t kTaskElements = 16384;

void group_norm_cpu(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                    const Tensor& bias, const ChannelGeometry& g, int64_t groups, double eps) {
  visit_floating(x.dtype(), "group_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const int64_t cg = g.c / groups, len = cg * g.s;
    const T* px = x.data_ptr<T>();
    T* py = y.data_ptr<T>();
    A* pm = mean.data_ptr<A>();
    A* pr = rstd.data_ptr<A>();
    const A* w = nl::data_or_null<A>(weight);
    const A* b = nl::data_or_null<A>(bias);
    parallel_for(0, g.n * groups, std::max<int64_t>(1, kTaskElements / len), [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        const T* xr = px + r * len;
        const nl::Sums2 st = nl::run_pair_sums(xr, xr, len);
        const double m = st.a / double(len);
        const double rs = 1.0 / std::sqrt(std::max(0.0, st.b / double(len) - m * m) + eps);
        pm[r] = A(m);
        pr[r] = A(rs);
        const int64_t c0 = (r % groups) * cg;
        for (int64_t j = 0; j < cg; ++j) {
          const double scale = rs * (w ? double(w[c0 + j]) : 1.0);
          const double shift = (b ? double(b[c0 + j]) : 0.0) - m * scale;
          nl::scale_shift(py + r * len + j * g.s, xr + j * g.s, g.s, A(scale), A(shift));
        }
      }
    });
  });
}

void group_norm_backward_cpu(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                             const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                             const ChannelGeometry& g, int64_t groups) {
  visit_floating(x.dtype(), "group_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const int64_t cg = g.c / groups, len = cg * g.s;
    const T* px = x.data_ptr<T>();
    const T* pg = dy.data_ptr<T>();
    T* pdx = dx.defined() ? dx.data_ptr<T>() : nullptr;
    const A* pm = mean.data_ptr<A>();
    const A* pr = rstd.data_ptr<A>();
    const A* w = nl::data_or_null<A>(weight);
    // per (sample, channel): sum dy and sum dy * x
    double* sdy = cpu::thread_scratch<double>(0, size_t(2 * g.n * g.c));
    double* sdyx = sdy + g.n * g.c;
    parallel_for(0, g.n * groups, std::max<int64_t>(1, kTaskElements / len), [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        const int64_t c0 = (r % groups) * cg, base = r * cg;  // base: index of (n, c0) in [n * c]
        double m1 = 0, m2 = 0;  // sum over the row of dy w, and of dy w (x - mean)
        const double mu = double(pm[r]), rs = double(pr[r]);
        for (int64_t j = 0; j < cg; ++j) {
          const int64_t off = r * len + j * g.s;
          const nl::Sums2 s = nl::run_pair_sums(pg + off, px + off, g.s);
          sdy[base + j] = s.a;
          sdyx[base + j] = s.b;
          const double wc = w ? double(w[c0 + j]) : 1.0;
          m1 += wc * s.a;
          m2 += wc * (s.b - mu * s.a);
        }
        if (!pdx) continue;
        m1 /= double(len);
        m2 = m2 * rs / double(len);
        // dx = rs (dy w - m1 - xhat m2) = dy (rs w) + x (-rs^2 m2) + (rs^2 mu m2 - rs m1)
        const double b = -rs * rs * m2, d = rs * rs * mu * m2 - rs * m1;
        for (int64_t j = 0; j < cg; ++j) {
          const int64_t off = r * len + j * g.s;
          const double a = rs * (w ? double(w[c0 + j]) : 1.0);
          nl::combine(pdx + off, pg + off, px + off, g.s, A(a), A(b), A(d));
        }
      }
    });
    // dweight[c] = sum_n rstd (sum dy x - mean sum dy), dbias[c] = sum_n sum dy
    A* dw = dweight.defined() ? dweight.data_ptr<A>() : nullptr;
    A* db = dbias.defined() ? dbias.data_ptr<A>() : nullptr;
    for (int64_t c = 0; c < g.c && (dw || db); ++c) {
      double aw = 0, ab = 0;
      for (int64_t n = 0; n < g.n; ++n) {
        const int64_t r = n * groups + c / cg, i = n * g.c + c;
        aw += double(pr[r]) * (sdyx[i] - double(pm[r]) * sdy[i]);
        ab += sdy[i];
      }
      if (dw) dw[c] = A(aw);
      if (db) db[c] = A(ab);
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::group_norm_stub, CPU, &group_norm_cpu);
EMBER_REGISTER_KERNEL(native::group_norm_backward_stub, CPU, &group_norm_backward_cpu);

}  // namespace ember
