// CPU kernels of the two-operand elementwise ops: arithmetic, comparisons, where, masked_fill.
// Each row of the strided walk takes a contiguous path when it can (same-shape operands, or one
// operand broadcast as a scalar) so the compiler vectorises it; half types compute in float,
// converted to and from it a block at a time.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/native/elementwise.h"
#include "core/strided_loop.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {

using native::BinaryOp;
using native::CompareOp;

template <typename T>
constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// ---- half types: contiguous rows are converted to float a block at a time (8 lanes at once,
// kernels/cpu/vec_half.h), combined by the same float loop as f32 data, and converted back.

constexpr int64_t kHalfBlock = 256;

// p as float values: p itself for float data, else converted into buf (n <= kHalfBlock).
template <typename T>
const acc_t<T>* acc_view(const T* p, int64_t n, float* buf) {
  if constexpr (is_half_v<T>) {
    cpu::vec8::convert_row(buf, p, n);
    return buf;
  } else {
    return p;
  }
}

// o[i] = Out(r[i]) for a block computed in float (a no-op copy-back for non-half outputs).
template <typename Out, typename R>
void store_block(Out* o, const R* r, int64_t n) {
  if constexpr (is_half_v<Out>) cpu::vec8::convert_row(o, r, n);
}

// out[i] = f(a[i], b[i]) over out's shape; f receives values converted to acc_t.
template <typename Out, typename A, typename B, typename F>
void zip_kernel(const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  StridedLoop loop(out.shape(), {out, a, b});
  loop.run([&](char** p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const A* x = reinterpret_cast<const A*>(p[1]);
    const B* y = reinterpret_cast<const B*>(p[2]);
    constexpr int64_t so = sizeof(Out), sa = sizeof(A), sb = sizeof(B);
    if constexpr (is_half_v<Out> || is_half_v<A> || is_half_v<B>) {
      if (s[0] == so && s[1] == sa && (s[2] == sb || s[2] == 0)) {
        const bool b_scalar = s[2] == 0;
        const acc_t<B> yv = acc_t<B>(*y);
        float xb[kHalfBlock], yb[kHalfBlock], ob[kHalfBlock];
        for (int64_t c = 0; c < n; c += kHalfBlock) {
          const int64_t len = std::min(kHalfBlock, n - c);
          const acc_t<A>* xs = acc_view(x + c, len, xb);
          if constexpr (is_half_v<Out>) {
            if (b_scalar) {
              for (int64_t i = 0; i < len; ++i) ob[i] = float(f(xs[i], yv));
            } else {
              const acc_t<B>* ys = acc_view(y + c, len, yb);
              for (int64_t i = 0; i < len; ++i) ob[i] = float(f(xs[i], ys[i]));
            }
            store_block(o + c, ob, len);
          } else if (b_scalar) {
            for (int64_t i = 0; i < len; ++i) o[c + i] = Out(f(xs[i], yv));
          } else {
            const acc_t<B>* ys = acc_view(y + c, len, yb);
            for (int64_t i = 0; i < len; ++i) o[c + i] = Out(f(xs[i], ys[i]));
          }
        }
        return;
      }
    }
    if (s[0] == so && s[1] == sa && s[2] == sb) {
      for (int64_t i = 0; i < n; ++i) o[i] = Out(f(acc_t<A>(x[i]), acc_t<B>(y[i])));
    } else if (s[0] == so && s[1] == sa && s[2] == 0) {
      const acc_t<B> yv = acc_t<B>(*y);
      for (int64_t i = 0; i < n; ++i) o[i] = Out(f(acc_t<A>(x[i]), yv));
    } else if (s[0] == so && s[1] == 0 && s[2] == sb) {
      const acc_t<A> xv = acc_t<A>(*x);
      for (int64_t i = 0; i < n; ++i) o[i] = Out(f(xv, acc_t<B>(y[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const A xv = *reinterpret_cast<const A*>(p[1] + i * s[1]);
        const B yv = *reinterpret_cast<const B*>(p[2] + i * s[2]);
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = Out(f(acc_t<A>(xv), acc_t<B>(yv)));
      }
    }
  });
}

// out[i] = f(a[i]) over out's shape (a may be broadcast).
template <typename Out, typename A, typename F>
void map_kernel(const Tensor& out, const Tensor& a, const F& f) {
  StridedLoop loop(out.shape(), {out, a});
  loop.run([&](char** p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const A* x = reinterpret_cast<const A*>(p[1]);
    if constexpr (is_half_v<Out> || is_half_v<A>) {
      if (s[0] == int64_t(sizeof(Out)) && s[1] == int64_t(sizeof(A))) {
        float xb[kHalfBlock], ob[kHalfBlock];
        for (int64_t c = 0; c < n; c += kHalfBlock) {
          const int64_t len = std::min(kHalfBlock, n - c);
          const acc_t<A>* xs = acc_view(x + c, len, xb);
          if constexpr (is_half_v<Out>) {
            for (int64_t i = 0; i < len; ++i) ob[i] = float(f(xs[i]));
            store_block(o + c, ob, len);
          } else {
            for (int64_t i = 0; i < len; ++i) o[c + i] = Out(f(xs[i]));
          }
        }
        return;
      }
    }
    if (s[0] == int64_t(sizeof(Out)) && s[1] == int64_t(sizeof(A))) {
      for (int64_t i = 0; i < n; ++i) o[i] = Out(f(acc_t<A>(x[i])));
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = Out(f(acc_t<A>(*reinterpret_cast<const A*>(p[1] + i * s[1]))));
    }
  });
}

// NaN-propagating max/min, like PyTorch's maximum/minimum.
template <typename A> A max_of(A x, A y) {
  if constexpr (std::is_floating_point_v<A>) return (x != x || x > y) ? x : y;
  else return x > y ? x : y;
}
template <typename A> A min_of(A x, A y) {
  if constexpr (std::is_floating_point_v<A>) return (x != x || x < y) ? x : y;
  else return x < y ? x : y;
}

// Runs `run(f)` with the arithmetic function of `op` in accumulation type A.
template <typename T, typename Run>
void with_binary_fn(BinaryOp op, double alpha, const Run& run) {
  using A = acc_t<T>;
  constexpr bool floating = std::is_floating_point_v<A>;
  const A al = A(alpha);
  switch (op) {
    case BinaryOp::Add:
      if (alpha == 1.0) return run([](A x, A y) { return x + y; });
      return run([al](A x, A y) { return x + al * y; });
    case BinaryOp::Sub:
      if (alpha == 1.0) return run([](A x, A y) { return x - y; });
      return run([al](A x, A y) { return x - al * y; });
    case BinaryOp::Mul: return run([](A x, A y) { return x * y; });
    case BinaryOp::Maximum: return run([](A x, A y) { return max_of(x, y); });
    case BinaryOp::Minimum: return run([](A x, A y) { return min_of(x, y); });
    case BinaryOp::Div:
      if constexpr (floating) return run([](A x, A y) { return x / y; });
      break;
    case BinaryOp::Pow:
      if constexpr (floating) return run([](A x, A y) { return std::pow(x, y); });
      break;
  }
  EMBER_FAIL(native::op_name(op), ": not supported for ", dtype_name(dtype_of<T>::value), " tensors");
}

void binary_cpu(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  visit_all(out.dtype(), native::op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    // on bool, add/maximum act as logical or and mul/minimum as logical and
    with_binary_fn<T>(op, alpha, [&](auto f) { zip_kernel<T, T, T>(out, a, b, f); });
  });
}

void binary_scalar_cpu(BinaryOp op, const Tensor& out, const Tensor& a, double s) {
  visit_all(out.dtype(), native::op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A sv = A(s);
    with_binary_fn<T>(op, 1.0, [&](auto f) {
      map_kernel<T, T>(out, a, [&](A x) { return f(x, sv); });
    });
  });
}

template <typename A, typename Run>
void with_compare_fn(CompareOp op, const Run& run) {
  switch (op) {
    case CompareOp::Eq: return run([](A x, A y) { return x == y; });
    case CompareOp::Ne: return run([](A x, A y) { return x != y; });
    case CompareOp::Lt: return run([](A x, A y) { return x < y; });
    case CompareOp::Le: return run([](A x, A y) { return x <= y; });
    case CompareOp::Gt: return run([](A x, A y) { return x > y; });
    case CompareOp::Ge: return run([](A x, A y) { return x >= y; });
  }
}

void compare_cpu(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_all(a.dtype(), native::op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_compare_fn<acc_t<T>>(op, [&](auto f) { zip_kernel<bool, T, T>(out, a, b, f); });
  });
}

void compare_scalar_cpu(CompareOp op, const Tensor& out, const Tensor& a, double s) {
  visit_all(a.dtype(), native::op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      // the scalar takes the tensor's dtype first, so x == 0.1 holds where x was set from 0.1
      const acc_t<T> sv = acc_t<T>(T(s));
      with_compare_fn<acc_t<T>>(op, [&](auto f) {
        map_kernel<bool, T>(out, a, [&](acc_t<T> x) { return f(x, sv); });
      });
    } else {
      // integers compare exactly against the double scalar
      with_compare_fn<double>(op, [&](auto f) {
        map_kernel<bool, T>(out, a, [&](acc_t<T> x) { return f(double(x), s); });
      });
    }
  });
}

void where_cpu(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  StridedLoop loop(out.shape(), {out, cond, a, b});
  visit_all(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    loop.run([&](char** p, const int64_t* s, int64_t n) {
      constexpr int64_t e = sizeof(T);
      if (s[0] == e && s[1] == 1 && s[2] == e && s[3] == e) {
        T* o = reinterpret_cast<T*>(p[0]);
        const bool* c = reinterpret_cast<const bool*>(p[1]);
        const T* x = reinterpret_cast<const T*>(p[2]);
        const T* y = reinterpret_cast<const T*>(p[3]);
        for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : y[i];
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const bool c = *reinterpret_cast<const bool*>(p[1] + i * s[1]);
          *reinterpret_cast<T*>(p[0] + i * s[0]) =
              *reinterpret_cast<const T*>(p[c ? 2 : 3] + i * s[c ? 2 : 3]);
        }
      }
    });
  });
}

void masked_fill_cpu(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  visit_all(out.dtype(), "masked_fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    if constexpr (std::is_same_v<T, bool>) v = value != 0.0;
    else if constexpr (is_half_v<T>) v = T(float(value));
    else v = T(value);
    const acc_t<T> va = acc_t<T>(v);
    zip_kernel<T, T, bool>(out, x, mask, [va](acc_t<T> xv, bool m) { return m ? va : xv; });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::binary_stub, CPU, &binary_cpu);
EMBER_REGISTER_KERNEL(native::binary_scalar_stub, CPU, &binary_scalar_cpu);
EMBER_REGISTER_KERNEL(native::compare_stub, CPU, &compare_cpu);
EMBER_REGISTER_KERNEL(native::compare_scalar_stub, CPU, &compare_scalar_cpu);
EMBER_REGISTER_KERNEL(native::where_stub, CPU, &where_cpu);
EMBER_REGISTER_KERNEL(native::masked_fill_stub, CPU, &masked_fill_cpu);

}  // namespace ember
