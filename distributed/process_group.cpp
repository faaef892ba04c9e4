#include "distributed/process_group.h"

#include <algorithm>

#include "core/error.h"
#include "distributed/collective_checks.h"
#include "distributed/process_group_gloo.h"
#if defined(EMBER_WITH_NCCL)
#include "distributed/nccl/process_group_nccl.h"
#endif

namespace ember::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "unknown";
}

std::string collective_where(const char* op, int size, int rank) {
  return detail::str_cat(op, " (world ", size, ", rank ", rank, ")");
}

void check_reduce_op_dtype(const std::string& where, ReduceOp op, const Tensor& t) {
  EMBER_CHECK(op != ReduceOp::Avg || t.is_floating_point(), where, ": avg is defined for floating-point tensors only, got ",
              t.dtype(), " (reduce with sum and divide as needed)");
}

void check_root(const std::string& where, int root, int size) {
  EMBER_CHECK(root >= 0 && root < size, where, ": root ", root, " is out of range for world size ", size);
}

void check_reduce_scatter(const std::string& where, const Tensor& output, const Tensor& input, ReduceOp op, int size) {
  EMBER_CHECK(input.dim() >= 1 && input.size(0) % size == 0, where, ": input dim 0 must split into ", size,
              " equal chunks, got shape ", input.shape());
  Shape chunk = input.shape();
  chunk[0] /= size;
  EMBER_CHECK(output.shape() == chunk, where, ": output shape ", output.shape(), " does not match one chunk of input ",
              input.shape(), " (expected ", chunk, ")");
  EMBER_CHECK(output.dtype() == input.dtype(), where, ": output dtype ", output.dtype(), " differs from input dtype ",
              input.dtype());
  check_reduce_op_dtype(where, op, input);
}

void check_allgather_into(const std::string& where, const Tensor& output, const Tensor& input, int size) {
  const int64_t want = int64_t(size) * input.numel();
  EMBER_CHECK(output.numel() == want, where, ": output has ", output.numel(), " elements (shape ", output.shape(),
              ") but world size ", size, " times input's ", input.numel(), " elements (shape ", input.shape(),
              ") is ", want);
  EMBER_CHECK(output.dtype() == input.dtype(), where, ": output dtype ", output.dtype(), " differs from input dtype ",
              input.dtype());
  EMBER_CHECK(output.device() == input.device(), where, ": output is on ", output.device(), " but input on ",
              input.device());
}

bool bytes_overlap(const Tensor& a, const Tensor& b) {
  const size_t a_bytes = size_t(a.numel()) * a.element_size(), b_bytes = size_t(b.numel()) * b.element_size();
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto* pa = static_cast<const uint8_t*>(a.raw_data());
  const auto* pb = static_cast<const uint8_t*>(b.raw_data());
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

std::optional<std::string> allgather_mismatch(const std::string& where, const Shape& mine, DType mine_dtype,
                                              const std::vector<Shape>& shapes, const std::vector<DType>& dtypes) {
  bool same = true;
  for (size_t r = 0; r < shapes.size(); ++r)
    same = same && dtypes[r] == mine_dtype && shapes[r].size() == mine.size() &&
           std::equal(mine.begin() + std::min<size_t>(1, mine.size()), mine.end(),
                      shapes[r].begin() + std::min<size_t>(1, shapes[r].size()));
  if (same) return std::nullopt;
  std::string msg = where + ": shapes may differ only in dim 0 and dtypes must agree, got ";
  for (size_t r = 0; r < shapes.size(); ++r)
    msg += (r ? ", " : "") + detail::str_cat("rank ", r, " ", shapes[r], " ", dtype_name(dtypes[r]));
  return msg;
}

Shape allgather_output_shape(const Shape& mine, const std::vector<Shape>& shapes) {
  int64_t rows = 0;
  for (const auto& s : shapes) rows += s.empty() ? 1 : s[0];
  Shape out = mine;
  if (out.empty()) out = {rows};
  else out[0] = rows;
  return out;
}

std::vector<size_t> allgather_counts(const std::vector<Shape>& shapes) {
  std::vector<size_t> counts;
  for (const auto& s : shapes) counts.push_back(size_t(s.empty() ? 1 : numel_of(s)));
  return counts;
}

std::vector<Tensor> split_allgather_output(const Tensor& out, const std::vector<Shape>& shapes) {
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (const auto& s : shapes) {
    if (s.empty()) {
      pieces.push_back(out.select(0, start++));
    } else {
      pieces.push_back(out.narrow(0, start, s[0]));
      start += s[0];
    }
  }
  return pieces;
}

std::shared_ptr<Store> group_key_space(const std::shared_ptr<Store>& store, int rank) {
  EMBER_CHECK(store != nullptr, "process group: the store is null");
  const int64_t n = store->add("ember_pg_created/" + std::to_string(rank), 1);
  return std::make_shared<PrefixStore>("ember_pg" + std::to_string(n), store);
}

std::shared_ptr<ProcessGroup> new_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                const std::string& backend, ProcessGroupOptions options) {
  if (backend == "gloo") return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, options);
  if (backend == "nccl") {
#if defined(EMBER_WITH_NCCL)
    return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, options);
#else
    EMBER_FAIL("new_process_group: backend 'nccl' needs a build with CUDA (this one has none); use 'gloo'");
#endif
  }
  EMBER_FAIL("new_process_group: unknown backend '", backend, "' (expected 'gloo' or 'nccl')");
}

}  // namespace ember::distributed
