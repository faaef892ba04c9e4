// CPU matmul: maps a batched product onto as few GEMM calls as the operands' layouts allow.
//
// - Right operand shared by every batch entry and left operand's batch dims stacking its rows
//   (any contiguous [B, S, H] input, as in linear layers): one GEMM with B*S rows.
// - Otherwise one GEMM per batch entry: many small ones run side by side across threads (each
//   GEMM single-threaded), few large ones run one after another, each using every thread.
// bf16 operands go to the bf16 GEMM (f32 accumulation, C rounded to bf16 once); f16 operands
// are widened to f32, multiplied, and rounded once on the way out.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/native/copy.h"
#include "core/native/linalg.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/gemm.h"

namespace ember {
namespace {

using native::BlasMatrix;

BlasMatrix matrix_of(const Tensor& x) { return native::operand_matrix(x, "CPU kernel"); }
using native::shared_across_batch;

// Element offset of each batch entry of x (batch dims = all but the last two).
std::vector<int64_t> batch_offsets(const Tensor& x, int64_t count) {
  const int64_t nb = x.dim() - 2;
  std::vector<int64_t> offs(size_t(count), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rem = i, off = 0;
    for (int64_t d = nb - 1; d >= 0; --d) {
      off += (rem % x.shape()[d]) * x.strides()[d];
      rem /= x.shape()[d];
    }
    offs[size_t(i)] = off;
  }
  return offs;
}

// Fills every row of C with the bias (k == 0, and f64, whose GEMM accumulates onto C).
template <typename T>
void seed_rows(T* c, int64_t rows, int64_t cols, const T* bias) {
  for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + cols, c + r * cols);
}

// C = op(A) op(B) (+ bias on every row). f32 and bf16 add the bias in the GEMM (gemm_bias: in
// the packed GEMM's epilogue, C written once); f64 seeds C and accumulates onto it. bf16
// products accumulate in f32 and round into C once.
template <typename T>
void gemm_into(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
               int64_t ldb, const T* bias, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, double>) {
    if (bias) {
      parallel_for(0, m, std::max<int64_t>(1, 16384 / n),
                   [&](int64_t r0, int64_t r1) { seed_rows(c + r0 * ldc, r1 - r0, n, bias); });
    }
    cpu::gemm<T>(trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, bias ? T(1) : T(0), c, ldc);
  } else if (bias) {
    cpu::gemm_bias(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c, ldc);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    cpu::gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  } else {
    cpu::gemm<T>(trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, T(0), c, ldc);
  }
}

template <typename T>
void matmul_typed(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  const int64_t nd = out.dim();
  const int64_t n = out.shape()[nd - 2], m = out.shape()[nd - 1], k = a.shape()[nd - 1];
  const int64_t batches = out.numel() / (n * m);
  T* c = out.data_ptr<T>();
  const T* pa = a.data_ptr<T>();
  const T* pb = b.data_ptr<T>();
  const T* pbias = bias.defined() ? bias.data_ptr<T>() : nullptr;
  if (k == 0) {
    // Empty sums: every row is the bias, or zero. (The operands may have no memory at all, and
    // offsetting their null pointers per batch would be undefined behaviour.)
    if (pbias) seed_rows(c, batches * n, m, pbias);
    else std::fill(c, c + out.numel(), T(0));
    return;
  }
  const BlasMatrix lb = matrix_of(b);

  if (shared_across_batch(b)) {
    if (auto la = native::folded_rows_matrix(a)) {
      gemm_into(la->col_major, lb.col_major, batches * n, m, k, pa, la->ld, pb, lb.ld, pbias, c, m);
      return;
    }
  }

  const BlasMatrix la = matrix_of(a);
  const std::vector<int64_t> a_off = batch_offsets(a, batches), b_off = batch_offsets(b, batches);
  auto one = [&](int64_t i) {
    gemm_into(la.col_major, lb.col_major, n, m, k, pa + a_off[size_t(i)], la.ld, pb + b_off[size_t(i)], lb.ld, pbias,
              c + i * n * m, m);
  };
  // Splitting batches across threads needs no synchronisation inside a GEMM, so prefer it
  // unless the batches are few and large enough that an even split matters more.
  const int64_t threads = get_num_threads();
  const double work = double(n) * double(m) * double(k);
  const bool batches_divide_evenly = batches % threads == 0 || batches >= 4 * threads;
  if (threads > 1 && batches >= threads && (batches_divide_evenly || work < double(1 << 18))) {
    parallel_for(0, batches, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) one(i);
    });
  } else {
    for (int64_t i = 0; i < batches; ++i) one(i);
  }
}

// A float32 copy of x with the same logical shape; broadcast (stride-0) dims stay broadcast,
// so widening a half-precision operand never materialises its repeats.
Tensor widen_to_f32(const Tensor& x) {
  Shape base = x.shape();
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.strides()[d] == 0) base[d] = 1;
  const Tensor compact = make_view(x, base, x.strides(), x.storage_offset());
  const Tensor wide = native::to_dtype(compact, DType::f32);
  return make_view(wide, x.shape(), broadcast_strides(base, wide.strides(), x.shape()), 0);
}

void matmul_cpu(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  if (out.numel() == 0) return;
  if (out.dtype() == DType::bf16) {
    matmul_typed<BFloat16>(out, a, b, bias);
    return;
  }
  if (out.dtype() == DType::f16) {
    Tensor out32 = make_tensor(out.shape(), DType::f32, out.device());
    const Tensor bias32 = bias.defined() ? native::to_dtype(bias, DType::f32) : Tensor();
    matmul_typed<float>(out32, widen_to_f32(a), widen_to_f32(b), bias32);
    native::copy_(out, out32);
    return;
  }
  visit_floating(out.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) matmul_typed<T>(out, a, b, bias);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::matmul_stub, CPU, &matmul_cpu);

}  // namespace ember
