// CPU optimizer steps and the gradient norm on row-sparse gradients (core/sparse_grad.h),
// bit for bit what the dense kernels give on the zero-filled gradient: each parameter row
// takes the same element updates (optim_updates.h) with its gradient row, or a row of zeros.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/native/fused_optim.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/optim_updates.h"
#include "kernels/cpu/sum_order.h"

namespace ember {
namespace {

// Runs row_fn(parameter row offset, gradient row) for every row of `param`, in parallel, with
// P and G its element and gradient types; rows without a gradient row get a row of zeros.
template <typename RowFn>
void for_each_row(const char* op, const Tensor& param, const Tensor& row_index, const Tensor& row_values,
                  const RowFn& row_fn) {
  const int64_t rows = param.size(0), width = param.size(1), k = row_index.numel();
  const int64_t* index = row_index.data_ptr<int64_t>();
  visit_floating(param.dtype(), op, [&](auto ptag) {
    using P = typename decltype(ptag)::type;
    visit_floating(row_values.dtype(), op, [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      const G* values = row_values.data_ptr<G>();
      const std::vector<G> zeros(size_t(width), G(0.0f));
      parallel_for(0, rows, std::max<int64_t>(1, 16384 / width), [&](int64_t b, int64_t e) {
        int64_t at = std::lower_bound(index, index + k, b) - index;  // the first gradient row at or after b
        for (int64_t r = b; r < e; ++r) {
          const bool has_row = at < k && index[at] == r;
          row_fn(P{}, r * width, has_row ? values + at * width : zeros.data());
          if (has_row) ++at;
        }
      });
    });
  });
}

void adam_rows_cpu(const Tensor& param, const Tensor& row_index, const Tensor& row_values, const Tensor& m,
                   const Tensor& v, const native::AdamStepArgs& args) {
  EMBER_CHECK(m.dtype() == param.dtype() && v.dtype() == param.dtype(), "adam_rows_step: optimizer state dtype ",
              dtype_name(m.dtype()), " differs from parameter dtype ", dtype_name(param.dtype()));
  const int64_t width = param.size(1);
  for_each_row("adam_rows_step", param, row_index, row_values, [&](auto ptag, int64_t o, const auto* g) {
    using P = decltype(ptag);
    const auto c = kernels::adam_coefficients<acc_t<P>>(args);
    cpu::adam_range(param.data_ptr<P>() + o, g, m.data_ptr<P>() + o, v.data_ptr<P>() + o, 0, width, c);
  });
}

void sgd_rows_cpu(const Tensor& param, const Tensor& row_index, const Tensor& row_values, const Tensor& buf,
                  const native::SgdStepArgs& args) {
  const int64_t width = param.size(1);
  for_each_row("sgd_rows_step", param, row_index, row_values, [&](auto ptag, int64_t o, const auto* g) {
    using P = decltype(ptag);
    const auto c = cpu::sgd_coefficients<acc_t<P>>(args);
    cpu::sgd_range(param.data_ptr<P>() + o, g, buf.defined() ? buf.data_ptr<P>() + o : nullptr, 0, width, c);
  });
}

// sum() of the squares of a [rows, width] tensor that is zero outside the given rows, in sum()'s
// order (sum_order.h): the zeros would only add +0 to the partial sums, which changes nothing,
// so the squares of the rows alone go to the accumulators they would have reached.
template <typename T>
double rows_sum_of_squares_typed(const int64_t* index, int64_t k, const T* values, int64_t width, int64_t rows) {
  const int64_t n = rows * width;
  double total = 0;
  int64_t chunk = -1, vector_end = 0;  // the chunk being summed; its elements before vector_end go to lanes
  double lanes[cpu::kSumLanes];
  double rest[cpu::kSumLanes];
  int rest_count = 0;
  const auto finish_chunk = [&] {
    if (chunk < 0) return;
    double s = 0;
    for (double lane : lanes) s += lane;
    for (int t = 0; t < rest_count; ++t) s += rest[t];
    total += s;
  };
  for (int64_t at = 0; at < k; ++at) {
    const T* row = values + at * width;
    const int64_t first = index[at] * width;
    for (int64_t j = 0; j < width; ++j) {
      const int64_t i = first + j;
      if (i / cpu::kSumRowChunk != chunk) {
        finish_chunk();
        chunk = i / cpu::kSumRowChunk;
        const int64_t begin = chunk * cpu::kSumRowChunk, len = std::min(n, begin + cpu::kSumRowChunk) - begin;
        vector_end = begin + len / cpu::kSumLanes * cpu::kSumLanes;
        std::fill(lanes, lanes + cpu::kSumLanes, 0.0);
        rest_count = 0;
      }
      const T a = std::abs(row[j]);
      const T square = a * a;  // rounded to T, as the dense a * a tensor is
      if (i < vector_end) lanes[(i - chunk * cpu::kSumRowChunk) % cpu::kSumLanes] += double(square);
      else rest[rest_count++] = double(square);
    }
  }
  finish_chunk();
  return total;
}

double rows_sum_of_squares_cpu(const Tensor& row_index, const Tensor& row_values, int64_t rows) {
  const int64_t k = row_index.numel(), width = row_values.size(1);
  const int64_t* index = row_index.data_ptr<int64_t>();
  if (row_values.dtype() == DType::f64)
    return rows_sum_of_squares_typed(index, k, row_values.data_ptr<double>(), width, rows);
  EMBER_CHECK(row_values.dtype() == DType::f32, "rows_sum_of_squares: expected f32 or f64 rows, got ",
              dtype_name(row_values.dtype()), " of shape ", row_values.shape());
  // sum() of an f32 tensor returns f32: the double sum is rounded once, as there.
  return double(float(rows_sum_of_squares_typed(index, k, row_values.data_ptr<float>(), width, rows)));
}

}  // namespace

EMBER_REGISTER_KERNEL(native::adam_rows_step_stub, CPU, &adam_rows_cpu);
EMBER_REGISTER_KERNEL(native::sgd_rows_step_stub, CPU, &sgd_rows_cpu);
EMBER_REGISTER_KERNEL(native::rows_sum_of_squares_stub, CPU, &rows_sum_of_squares_cpu);

}  // namespace ember
