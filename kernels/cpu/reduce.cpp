// CPU reductions over the [outer, reduced, inner] geometry of core/native/reduce.h.
//
// inner == 1: each output is a contiguous row, reduced by a vectorisable loop with several
// accumulators. inner > 1: outputs are columns, accumulated row by row into a block of
// per-column accumulators (independent lanes, so the loop vectorises).
// Floating sums accumulate in double. Long reductions are cut into fixed chunks whose
// partial results are combined in order, so results never depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/native/reduce.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif
#include "kernels/cpu/sum_order.h"
#include "kernels/cpu/vec8.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {
using native::ReduceGeometry;
using native::ReduceKind;

constexpr int64_t kRowChunk = cpu::kSumRowChunk;  // elements of one row per partial result
// Columns per block of accumulators: wide enough that each row contributes a few KiB of
// consecutive memory (narrow blocks of a wide matrix touch a new page on every row).
constexpr int64_t kColBlock = 1024;
constexpr int64_t kColRows = 512;     // rows per partial result when columns are split
constexpr int64_t kMinTasks = 64;     // below this many rows/blocks, long reductions are split
constexpr int64_t kGrainElems = 32768;

// Sums accumulate in double for floating types and in int64 for integers and bools.
template <typename T> using sum_t = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, int64_t>;

template <typename O, typename V>
O store_as(V v) {
  if constexpr (std::is_same_v<O, Half> || std::is_same_v<O, BFloat16>) return O(float(v));
  else return static_cast<O>(v);
}

template <typename V> bool is_nan(V v) {
  if constexpr (std::is_floating_point_v<V>) return v != v;
  else return false;
}

// ---- half-precision rows are converted to float a block at a time

constexpr int64_t kConvertBlock = 512;

inline void to_float(const Half* p, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
#endif
  for (; i < n; ++i) out[i] = float(p[i]);
}
inline void to_float(const BFloat16* p, float* out, int64_t n) { cpu::vec8::convert_row(out, p, n); }
template <typename T> constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Folds fn(float block, length) over p in converted blocks.
template <typename T, typename Fn>
void for_float_blocks(const T* p, int64_t n, const Fn& fn) {
  float buf[kConvertBlock];
  for (int64_t b = 0; b < n; b += kConvertBlock) {
    const int64_t len = std::min(kConvertBlock, n - b);
    to_float(p + b, buf, len);
    fn(static_cast<const float*>(buf), len);
  }
}

// 8-lane float vectors: kernels/cpu/vec8.h.
using namespace cpu::vec8;
constexpr int64_t kLanes8 = kLanes;

// ---- drivers

// rows x len contiguous rows. chunk(row, begin, end) -> Acc over [begin, end) of that row;
// combine(earlier, later) -> Acc; store(row, Acc). len >= 1.
template <typename Acc, typename Chunk, typename Combine, typename Store>
void reduce_rows(int64_t rows, int64_t len, const Chunk& chunk, const Combine& combine, const Store& store) {
  const int64_t nchunks = (len + kRowChunk - 1) / kRowChunk;
  auto whole_row = [&](int64_t r) {
    Acc acc = chunk(r, 0, std::min(len, kRowChunk));
    for (int64_t c = 1; c < nchunks; ++c) acc = combine(acc, chunk(r, c * kRowChunk, std::min(len, (c + 1) * kRowChunk)));
    return acc;
  };
  if (nchunks <= 1 || rows >= kMinTasks) {
    const int64_t grain = std::max<int64_t>(1, kGrainElems / len);
    parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) store(r, whole_row(r));
    });
    return;
  }
  std::unique_ptr<Acc[]> partial(new Acc[size_t(rows * nchunks)]);  // not vector: Acc may be bool
  parallel_for(0, rows * nchunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t r = t / nchunks, c = t % nchunks;
      partial[size_t(t)] = chunk(r, c * kRowChunk, std::min(len, (c + 1) * kRowChunk));
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    Acc acc = partial[size_t(r * nchunks)];
    for (int64_t c = 1; c < nchunks; ++c) acc = combine(acc, partial[size_t(r * nchunks + c)]);
    store(r, acc);
  }
}

// outer x len x inner, inner > 1. accumulate(buf, o, r0, r1, b0, width) sets buf[j] to the
// reduction over rows [r0, r1) of column b0 + j (width may be all of inner); combine as above;
// store(o, b0, buf, width) with width <= kColBlock.
template <typename Acc, typename Accumulate, typename Combine, typename Store>
void reduce_columns(int64_t outer, int64_t len, int64_t inner, const Accumulate& accumulate,
                    const Combine& combine, const Store& store) {
  const int64_t nblocks = (inner + kColBlock - 1) / kColBlock;
  const int64_t tasks = outer * nblocks;
  // Rows wider than a block are read whole, row after row, by the row-split path below: walking
  // one block down many rows touches a new page per row and defeats the prefetchers.
  const bool wide = inner > kColBlock;
  if ((!wide && tasks >= kMinTasks) || len <= 2 * kColRows) {
    const int64_t grain = std::max<int64_t>(1, kGrainElems / (len * std::min(inner, kColBlock)));
    parallel_for(0, tasks, grain, [&](int64_t b, int64_t e) {
      Acc buf[kColBlock];
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / nblocks, b0 = (t % nblocks) * kColBlock;
        const int64_t width = std::min(kColBlock, inner - b0);
        accumulate(buf, o, 0, len, b0, width);
        store(o, b0, static_cast<const Acc*>(buf), width);
      }
    });
    return;
  }
  // Many rows: split the rows too (into fixed chunks), then combine the partials in order. Each
  // task covers a block of columns, or whole rows when they are wide.
  const int64_t nchunks = (len + kColRows - 1) / kColRows;
  const int64_t plane = outer * inner;
  const int64_t task_width = wide ? inner : kColBlock, task_blocks = wide ? 1 : nblocks;
  const int64_t chunk_tasks = outer * task_blocks;
  std::unique_ptr<Acc[]> partial(new Acc[size_t(nchunks * plane)]);
  parallel_for(0, nchunks * chunk_tasks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t c = t / chunk_tasks, ob = t % chunk_tasks;
      const int64_t o = ob / task_blocks, b0 = (ob % task_blocks) * task_width;
      const int64_t width = std::min(task_width, inner - b0);
      accumulate(partial.get() + c * plane + o * inner + b0, o, c * kColRows,
                 std::min(len, (c + 1) * kColRows), b0, width);
    }
  });
  parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
    Acc buf[kColBlock];
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nblocks, b0 = (t % nblocks) * kColBlock;
      const int64_t width = std::min(kColBlock, inner - b0);
      const Acc* first = partial.get() + o * inner + b0;
      std::copy(first, first + width, buf);
      for (int64_t c = 1; c < nchunks; ++c) {
        const Acc* p = partial.get() + c * plane + o * inner + b0;
        for (int64_t j = 0; j < width; ++j) buf[j] = combine(buf[j], p[j]);
      }
      store(o, b0, static_cast<const Acc*>(buf), width);
    }
  });
}

// Runs the row or column driver for the geometry.
template <typename Acc, typename RowChunk, typename ColAccumulate, typename Combine, typename Store>
void run_reduction(const ReduceGeometry& g, const RowChunk& row_chunk, const ColAccumulate& col_accumulate,
                     const Combine& combine, const Store& store) {
  if (g.inner == 1) {
    reduce_rows<Acc>(g.outer, g.reduced, row_chunk, combine,
                     [&](int64_t r, const Acc& a) { store(r, 0, &a, 1); });
  } else {
    reduce_columns<Acc>(g.outer, g.reduced, g.inner, col_accumulate, combine,
                        [&](int64_t o, int64_t b0, const Acc* buf, int64_t w) { store(o, b0, buf, w); });
  }
}

// ---- sum and mean

template <typename T>
sum_t<T> sum_contiguous(const T* p, int64_t n) {
  using S = sum_t<T>;
  if constexpr (is_half_v<T>) {
    S s = 0;
    for_float_blocks(p, n, [&](const float* f, int64_t len) { s += sum_contiguous(f, len); });
    return s;
  }
  constexpr int kLanes = cpu::kSumLanes;
  S acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += S(acc_t<T>(p[i + k]));
  S s = 0;
  for (int k = 0; k < kLanes; ++k) s += acc[k];
  for (; i < n; ++i) s += S(acc_t<T>(p[i]));
  return s;
}

template <typename T>
void sum_kernel(const Tensor& out, const ReduceGeometry& g, bool mean) {
  using S = sum_t<T>;
  visit_all(out.dtype(), "sum", [&](auto out_tag) {
    using O = typename decltype(out_tag)::type;
    O* o = out.data_ptr<O>();
    const int64_t n_out = out.numel();
    if (g.reduced == 0) {
      const O fill = store_as<O>(mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
      std::fill(o, o + n_out, fill);
      return;
    }
    const T* x = static_cast<const T*>(g.src.raw_data());
    const int64_t len = g.reduced, inner = g.inner;
    auto finish = [&](S s) -> O {
      if constexpr (std::is_same_v<S, double>) return store_as<O>(mean ? s / double(len) : s);
      else return store_as<O>(s);
    };
    run_reduction<S>(
        g, [&](int64_t r, int64_t b, int64_t e) { return sum_contiguous(x + r * len + b, e - b); },
        [&](S* buf, int64_t oi, int64_t r0, int64_t r1, int64_t b0, int64_t w) {
          std::fill(buf, buf + w, S(0));
          for (int64_t r = r0; r < r1; ++r) {
            const T* row = x + (oi * len + r) * inner + b0;
            if constexpr (is_half_v<T>) {
              float wide[kConvertBlock];
              for (int64_t j0 = 0; j0 < w; j0 += kConvertBlock) {
                const int64_t n = std::min(kConvertBlock, w - j0);
                to_float(row + j0, wide, n);
                for (int64_t j = 0; j < n; ++j) buf[j0 + j] += S(wide[j]);
              }
            } else {
              for (int64_t j = 0; j < w; ++j) buf[j] += S(acc_t<T>(row[j]));
            }
          }
        },
        [](S a, S b) { return a + b; },
        [&](int64_t oi, int64_t b0, const S* buf, int64_t w) {
          for (int64_t j = 0; j < w; ++j) o[oi * inner + b0 + j] = finish(buf[j]);
        });
  });
}

// ---- amax and amin (NaN propagates)

template <typename V, bool IsMax> V pick(V a, V b) { return IsMax ? (b > a ? b : a) : (b < a ? b : a); }

// Max (or min) of a float row, or NaN when the row holds one.
template <bool IsMax>
float extreme_float(const float* p, int64_t n) {
  f8 m = f8{} + p[0];
  i8 nan = i8{};
  int64_t i = 0;
  for (; i + kLanes8 <= n; i += kLanes8) {
    const f8 v = load8(p + i);
    nan |= v != v;
    if constexpr (IsMax) m = v > m ? v : m;
    else m = v < m ? v : m;
  }
  float best = m[0];
  bool any_nan = false;
  for (int k = 0; k < kLanes8; ++k) {
    best = pick<float, IsMax>(best, m[k]);
    any_nan |= nan[k] != 0;
  }
  for (; i < n; ++i) {
    any_nan |= is_nan(p[i]);
    best = pick<float, IsMax>(best, p[i]);
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : best;
}

template <typename T, bool IsMax>
acc_t<T> extreme_contiguous(const T* p, int64_t n) {
  using V = acc_t<T>;
  if constexpr (std::is_same_v<T, float>) {
    return extreme_float<IsMax>(p, n);
  } else if constexpr (is_half_v<T>) {
    float best = float(p[0]);
    for_float_blocks(p, n, [&](const float* f, int64_t len) {
      const float m = extreme_float<IsMax>(f, len);
      best = is_nan(best) || is_nan(m) ? std::numeric_limits<float>::quiet_NaN() : pick<float, IsMax>(best, m);
    });
    return best;
  }
  constexpr int kLanes = 16;
  V acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = V(p[0]);
  bool nan = false;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const V v = V(p[i + k]);
      nan |= is_nan(v);
      acc[k] = pick<V, IsMax>(acc[k], v);
    }
  for (; i < n; ++i) {
    const V v = V(p[i]);
    nan |= is_nan(v);
    acc[0] = pick<V, IsMax>(acc[0], v);
  }
  if (nan) return std::numeric_limits<V>::quiet_NaN();
  V m = acc[0];
  for (int k = 1; k < kLanes; ++k) m = pick<V, IsMax>(m, acc[k]);
  return m;
}

template <typename T, bool IsMax>
void extreme_kernel(const Tensor& out, const ReduceGeometry& g) {
  using V = acc_t<T>;
  const T* x = static_cast<const T*>(g.src.raw_data());
  T* o = out.data_ptr<T>();
  const int64_t len = g.reduced, inner = g.inner;
  auto combine = [](V a, V b) { return is_nan(a) || is_nan(b) ? (is_nan(a) ? a : b) : pick<V, IsMax>(a, b); };
  run_reduction<V>(
      g, [&](int64_t r, int64_t b, int64_t e) { return extreme_contiguous<T, IsMax>(x + r * len + b, e - b); },
      [&](V* buf, int64_t oi, int64_t r0, int64_t r1, int64_t b0, int64_t w) {
        const T* first = x + (oi * len + r0) * inner + b0;
        for (int64_t j = 0; j < w; ++j) buf[j] = V(first[j]);
        for (int64_t r = r0 + 1; r < r1; ++r) {
          const T* row = x + (oi * len + r) * inner + b0;
          for (int64_t j = 0; j < w; ++j) {
            const V v = V(row[j]);
            // once a column holds NaN it keeps it: NaN compares false both ways
            buf[j] = (is_nan(v) || (IsMax ? v > buf[j] : v < buf[j])) ? v : buf[j];
          }
        }
      },
      combine,
      [&](int64_t oi, int64_t b0, const V* buf, int64_t w) {
        for (int64_t j = 0; j < w; ++j) o[oi * inner + b0 + j] = store_as<T>(buf[j]);
      });
}

void reduce_cpu(const Tensor& out, const ReduceGeometry& g, ReduceKind kind) {
  visit_all(g.src.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (kind) {
      case ReduceKind::sum: sum_kernel<T>(out, g, false); break;
      case ReduceKind::mean: sum_kernel<T>(out, g, true); break;
      case ReduceKind::amax: extreme_kernel<T, true>(out, g); break;
      case ReduceKind::amin: extreme_kernel<T, false>(out, g); break;
    }
  });
}

// ---- argmax and argmin: first index of the extreme; the first NaN wins outright

template <typename V> struct ArgAcc {
  V value;
  int64_t index;
};

template <typename V, bool IsMax> bool better(V v, V best) {
  return is_nan(v) || (IsMax ? v > best : v < best);
}

template <typename T, bool IsMax>
void arg_kernel(const Tensor& out, const ReduceGeometry& g) {
  using V = acc_t<T>;
  using A = ArgAcc<V>;
  const T* x = static_cast<const T*>(g.src.raw_data());
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t len = g.reduced, inner = g.inner;
  run_reduction<A>(
      g,
      [&](int64_t r, int64_t b, int64_t e) {
        // the (vectorised) extreme first, then the first position that holds it
        const T* p = x + r * len;
        const V m = extreme_contiguous<T, IsMax>(p + b, e - b);
        int64_t i = b;
        if (is_nan(m)) {
          while (!is_nan(V(p[i]))) ++i;
        } else {
          while (!(V(p[i]) == m)) ++i;
        }
        return A{m, i};
      },
      [&](A* buf, int64_t oi, int64_t r0, int64_t r1, int64_t b0, int64_t w) {
        const T* first = x + (oi * len + r0) * inner + b0;
        for (int64_t j = 0; j < w; ++j) buf[j] = {V(first[j]), r0};
        for (int64_t r = r0 + 1; r < r1; ++r) {
          const T* row = x + (oi * len + r) * inner + b0;
          for (int64_t j = 0; j < w; ++j) {
            const V v = V(row[j]);
            if (!is_nan(buf[j].value) && better<V, IsMax>(v, buf[j].value)) buf[j] = {v, r};
          }
        }
      },
      [](const A& a, const A& b) {
        if (is_nan(a.value)) return a;
        return better<V, IsMax>(b.value, a.value) ? b : a;
      },
      [&](int64_t oi, int64_t b0, const A* buf, int64_t w) {
        for (int64_t j = 0; j < w; ++j) o[oi * inner + b0 + j] = buf[j].index;
      });
}

void arg_reduce_cpu(const Tensor& out, const ReduceGeometry& g, bool is_max) {
  visit_all(g.src.dtype(), is_max ? "argmax" : "argmin", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (is_max) arg_kernel<T, true>(out, g);
    else arg_kernel<T, false>(out, g);
  });
}

// ---- variance: mean first, then the sum of squared deviations, both in double

template <typename T>
void var_kernel(const Tensor& out, const ReduceGeometry& g, int64_t correction) {
  T* o = out.data_ptr<T>();
  const int64_t n_out = out.numel();
  const int64_t len = g.reduced, inner = g.inner;
  if (len == 0) {
    std::fill(o, o + n_out, store_as<T>(std::numeric_limits<double>::quiet_NaN()));
    return;
  }
  const T* x = static_cast<const T*>(g.src.raw_data());
  const double dof = double(std::max<int64_t>(0, len - correction));
  std::vector<double> means(static_cast<size_t>(n_out));
  auto add = [](double a, double b) { return a + b; };
  run_reduction<double>(
      g, [&](int64_t r, int64_t b, int64_t e) { return sum_contiguous(x + r * len + b, e - b); },
      [&](double* buf, int64_t oi, int64_t r0, int64_t r1, int64_t b0, int64_t w) {
        std::fill(buf, buf + w, 0.0);
        for (int64_t r = r0; r < r1; ++r) {
          const T* row = x + (oi * len + r) * inner + b0;
          for (int64_t j = 0; j < w; ++j) buf[j] += double(row[j]);
        }
      },
      add,
      [&](int64_t oi, int64_t b0, const double* buf, int64_t w) {
        for (int64_t j = 0; j < w; ++j) means[size_t(oi * inner + b0 + j)] = buf[j] / double(len);
      });
  run_reduction<double>(
      g,
      [&](int64_t r, int64_t b, int64_t e) {
        const T* p = x + r * len;
        const double m = means[size_t(r)];
        double acc[4] = {};
        int64_t i = b;
        for (; i + 4 <= e; i += 4)
          for (int k = 0; k < 4; ++k) {
            const double d = double(p[i + k]) - m;
            acc[k] += d * d;
          }
        for (; i < e; ++i) {
          const double d = double(p[i]) - m;
          acc[0] += d * d;
        }
        return (acc[0] + acc[1]) + (acc[2] + acc[3]);
      },
      [&](double* buf, int64_t oi, int64_t r0, int64_t r1, int64_t b0, int64_t w) {
        const double* m = means.data() + oi * inner + b0;
        std::fill(buf, buf + w, 0.0);
        for (int64_t r = r0; r < r1; ++r) {
          const T* row = x + (oi * len + r) * inner + b0;
          for (int64_t j = 0; j < w; ++j) {
            const double d = double(row[j]) - m[j];
            buf[j] += d * d;
          }
        }
      },
      add,
      [&](int64_t oi, int64_t b0, const double* buf, int64_t w) {
        for (int64_t j = 0; j < w; ++j) o[oi * inner + b0 + j] = store_as<T>(buf[j] / dof);
      });
}

void var_cpu(const Tensor& out, const ReduceGeometry& g, int64_t correction) {
  visit_floating(g.src.dtype(), "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    var_kernel<T>(out, g, correction);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::reduce_stub, CPU, &reduce_cpu);
EMBER_REGISTER_KERNEL(native::arg_reduce_stub, CPU, &arg_reduce_cpu);
EMBER_REGISTER_KERNEL(native::var_stub, CPU, &var_cpu);

}  // namespace ember
