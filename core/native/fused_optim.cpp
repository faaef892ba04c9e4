#include "core/native/fused_optim.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace ember::native {

EMBER_DEFINE_STUB(adam_step_stub);
EMBER_DEFINE_STUB(adam_multi_step_stub);
EMBER_DEFINE_STUB(sgd_step_stub);
EMBER_DEFINE_STUB(adam_rows_step_stub);
EMBER_DEFINE_STUB(sgd_rows_step_stub);
EMBER_DEFINE_STUB(rows_sum_of_squares_stub);

namespace {
void check_same(const char* op, const Tensor& p, const Tensor& t, const char* what) {
  EMBER_CHECK(t.shape() == p.shape(), op, ": ", what, " has shape ", t.shape(), " but the parameter has ",
              p.shape());
  EMBER_CHECK(t.is_contiguous() && t.device() == p.device(), op, ": ", what,
              " must be contiguous and on the parameter's device");
}

// Entry i of adam_multi_step: defined, contiguous, one shape, on `device`, the shared dtypes.
void check_multi_entry(const AdamTensors& t, size_t i, Device device, DType param_dtype, DType grad_dtype) {
  const char* op = "adam_multi_step";
  const std::pair<const Tensor*, const char*> parts[] = {
      {&t.param, "param"}, {&t.grad, "grad"}, {&t.exp_avg, "exp_avg"}, {&t.exp_avg_sq, "exp_avg_sq"}};
  for (const auto& [x, what] : parts) {
    EMBER_CHECK(x->defined(), op, ": ", what, " of entry ", i, " is undefined");
    EMBER_CHECK(x->shape() == t.param.shape(), op, ": ", what, " of entry ", i, " has shape ", x->shape(),
                " but its param has ", t.param.shape());
    EMBER_CHECK(x->is_contiguous(), op, ": ", what, " of entry ", i, " must be contiguous");
    EMBER_CHECK(x->device() == device, op, ": ", what, " of entry ", i, " is on ", x->device(),
                " but entry 0 is on ", device);
    const DType want = x == &t.grad ? grad_dtype : param_dtype;
    EMBER_CHECK(x->dtype() == want, op, ": ", what, " of entry ", i, " has dtype ", dtype_name(x->dtype()),
                " but expected ", dtype_name(want), x == &t.grad ? " (the grad dtype of entry 0)"
                                                                  : " (the param dtype of entry 0)");
  }
}

// The bytes one non-empty entry writes (param, exp_avg, exp_avg_sq) must not overlap those of
// another: the CUDA kernel updates all entries concurrently. Within an entry, aliasing behaves
// as in adam_step.
void check_no_overlap(const std::vector<AdamTensors>& tensors) {
  struct Range {
    uintptr_t begin, end;
    size_t entry;
  };
  std::vector<Range> ranges;
  ranges.reserve(3 * tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].param.numel() == 0) continue;
    for (const Tensor* x : {&tensors[i].param, &tensors[i].exp_avg, &tensors[i].exp_avg_sq}) {
      const uintptr_t b = reinterpret_cast<uintptr_t>(x->raw_data());
      ranges.push_back({b, b + uintptr_t(x->numel()) * x->element_size(), i});
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  // Sweep in order of start, tracking the range that reaches furthest. The first range to
  // overlap an earlier one of another entry also overlaps that furthest-reaching range, which
  // belongs to another entry too (else those two earlier ranges would overlap first).
  uintptr_t reach = 0;
  size_t owner = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    const Range& r = ranges[k];
    EMBER_CHECK(k == 0 || r.begin >= reach || owner == r.entry, "adam_multi_step: entries ",
                std::min(owner, r.entry), " and ", std::max(owner, r.entry), " share memory");
    if (k == 0 || r.end > reach) {
      reach = r.end;
      owner = r.entry;
    }
  }
}
// The tensors an Adam step writes in place (the gradient is only read).
void bump_adam_versions(const AdamTensors& t) {
  t.param.bump_version();
  t.exp_avg.bump_version();
  t.exp_avg_sq.bump_version();
}

// row_index/row_values of a row-sparse gradient of `rows` rows of `width` values each.
void check_rows(const char* op, const Tensor& row_index, const Tensor& row_values, int64_t rows, int64_t width) {
  EMBER_CHECK(row_index.dtype() == DType::i64 && row_index.dim() == 1 && row_index.device().is_cpu() &&
                  row_index.is_contiguous(),
              op, ": row_index must be a contiguous int64 vector on the CPU, got ", dtype_name(row_index.dtype()),
              " of shape ", row_index.shape(), " on ", row_index.device());
  EMBER_CHECK(row_values.dim() == 2 && row_values.size(0) == row_index.numel() && row_values.size(1) == width &&
                  row_values.is_contiguous() && is_floating(row_values.dtype()),
              op, ": row_values of shape ", row_values.shape(), " do not fit ", row_index.numel(), " rows of ", width,
              " floating values, contiguous");
  const int64_t* index = row_index.data_ptr<int64_t>();
  for (int64_t k = 0; k < row_index.numel(); ++k)
    EMBER_CHECK(index[k] >= 0 && index[k] < rows && (k == 0 || index[k] > index[k - 1]), op, ": row_index[", k,
                "] = ", index[k], " is not ascending within [0, ", rows, ")");
}

void check_row_param(const char* op, const Tensor& param, const Tensor& row_index, const Tensor& row_values) {
  EMBER_CHECK(param.dim() == 2 && param.is_contiguous(), op, ": the parameter must be a contiguous matrix, got shape ",
              param.shape());
  check_rows(op, row_index, row_values, param.size(0), param.size(1));
}

}  // namespace

void adam_rows_step(const Tensor& param, const Tensor& row_index, const Tensor& row_values, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, const AdamStepArgs& args) {
  check_row_param("adam_rows_step", param, row_index, row_values);
  check_same("adam_rows_step", param, exp_avg, "exp_avg");
  check_same("adam_rows_step", param, exp_avg_sq, "exp_avg_sq");
  if (param.numel() == 0) return;
  adam_rows_step_stub.call(param.device(), "adam_rows_step")(param, row_index, row_values, exp_avg, exp_avg_sq, args);
  bump_adam_versions({param, Tensor(), exp_avg, exp_avg_sq});
}

void sgd_rows_step(const Tensor& param, const Tensor& row_index, const Tensor& row_values, const Tensor& buf,
                   const SgdStepArgs& args) {
  check_row_param("sgd_rows_step", param, row_index, row_values);
  if (buf.defined()) check_same("sgd_rows_step", param, buf, "momentum buffer");
  if (param.numel() == 0) return;
  sgd_rows_step_stub.call(param.device(), "sgd_rows_step")(param, row_index, row_values, buf, args);
  param.bump_version();
  if (buf.defined()) buf.bump_version();
}

double rows_sum_of_squares(const Tensor& row_index, const Tensor& row_values, int64_t rows) {
  EMBER_CHECK(row_values.dim() == 2, "rows_sum_of_squares: row_values must be a matrix, got shape ",
              row_values.shape());
  check_rows("rows_sum_of_squares", row_index, row_values, rows, row_values.size(1));
  return rows_sum_of_squares_stub.call(row_values.device(), "rows_sum_of_squares")(row_index, row_values, rows);
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const AdamStepArgs& args) {
  EMBER_CHECK(param.is_contiguous(), "adam_step: parameter must be contiguous");
  check_same("adam_step", param, grad, "grad");
  check_same("adam_step", param, exp_avg, "exp_avg");
  check_same("adam_step", param, exp_avg_sq, "exp_avg_sq");
  if (param.numel() == 0) return;
  adam_step_stub.call(param.device(), "adam_step")(param, grad, exp_avg, exp_avg_sq, args);
  bump_adam_versions({param, grad, exp_avg, exp_avg_sq});
}

void adam_multi_step(const std::vector<AdamTensors>& tensors, const AdamStepArgs& args) {
  if (tensors.empty()) return;
  EMBER_CHECK(tensors[0].param.defined(), "adam_multi_step: param of entry 0 is undefined");
  EMBER_CHECK(tensors[0].grad.defined(), "adam_multi_step: grad of entry 0 is undefined");
  const Device device = tensors[0].param.device();
  const DType param_dtype = tensors[0].param.dtype(), grad_dtype = tensors[0].grad.dtype();
  EMBER_CHECK(is_floating(param_dtype) && is_floating(grad_dtype),
              "adam_multi_step: expected floating-point params and grads, got ", dtype_name(param_dtype), " and ",
              dtype_name(grad_dtype));
  std::vector<AdamTensors> work;
  work.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_multi_entry(tensors[i], i, device, param_dtype, grad_dtype);
    if (tensors[i].param.numel() > 0) work.push_back(tensors[i]);
  }
  if (work.empty()) return;
  check_no_overlap(tensors);
  adam_multi_step_stub.call(device, "adam_multi_step")(work, args);
  for (const AdamTensors& t : work) bump_adam_versions(t);
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStepArgs& args) {
  EMBER_CHECK(param.is_contiguous(), "sgd_step: parameter must be contiguous");
  check_same("sgd_step", param, grad, "grad");
  if (buf.defined()) check_same("sgd_step", param, buf, "momentum buffer");
  if (param.numel() == 0) return;
  sgd_step_stub.call(param.device(), "sgd_step")(param, grad, buf, args);
  param.bump_version();
  if (buf.defined()) buf.bump_version();
}

}  // namespace ember::native
