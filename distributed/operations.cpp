#include "distributed/operations.h"

#include <cstring>

#include "core/error.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace ember::distributed {

namespace {

// The device the group moves bytes from: host memory for gloo.
bool needs_host_copy(const Tensor& t, const ProcessGroup& pg) { return t.is_cuda() && pg.backend_name() == "gloo"; }

Tensor to_wire(const Tensor& t, const ProcessGroup& pg) {
  Tensor c = t.detach();
  if (needs_host_copy(c, pg)) c = c.to(Device::cpu());
  return c.contiguous().clone();
}

Tensor from_wire(const Tensor& t, Device device) { return t.device() == device ? t : t.to(device); }

}  // namespace

Tensor gather(const Tensor& tensor, ProcessGroup* pg) {
  EMBER_CHECK(tensor.defined(), "gather: the tensor is undefined");
  NoGradGuard no_grad;
  Tensor rows = tensor.dim() == 0 ? tensor.reshape({1}) : tensor;
  if (!pg || pg->size() == 1) return rows.detach().clone();
  std::vector<Tensor> parts = pg->allgather(to_wire(rows, *pg));
  return from_wire(cat(parts, 0), tensor.device());
}

Tensor reduce(const Tensor& tensor, const std::string& reduction, ProcessGroup* pg, double scale) {
  EMBER_CHECK(tensor.defined(), "reduce: the tensor is undefined");
  EMBER_CHECK(reduction == "sum" || reduction == "mean", "reduce: reduction must be 'sum' or 'mean', got '",
              reduction, "'");
  EMBER_CHECK(reduction != "mean" || tensor.is_floating_point(), "reduce: 'mean' needs a floating-point tensor, got ",
              dtype_name(tensor.dtype()), " (reduce with 'sum' and divide)");
  NoGradGuard no_grad;
  Tensor out;
  if (!pg || pg->size() == 1) {
    out = tensor.detach().clone();
  } else {
    Tensor wire = to_wire(tensor, *pg);
    pg->allreduce(wire, reduction == "mean" ? ReduceOp::Avg : ReduceOp::Sum)->wait();
    out = from_wire(wire, tensor.device());
  }
  if (scale != 1.0) {
    EMBER_CHECK(out.is_floating_point(), "reduce: scale ", scale, " needs a floating-point tensor, got ",
                dtype_name(out.dtype()));
    out = out * scale;
  }
  return out;
}

Tensor pad_across_processes(const Tensor& tensor, ProcessGroup* pg, int64_t dim, double pad_index, bool pad_first) {
  EMBER_CHECK(tensor.defined(), "pad_across_processes: the tensor is undefined");
  EMBER_CHECK(tensor.dim() >= 1, "pad_across_processes: needs a tensor with at least one dim, got shape ",
              tensor.shape());
  const int64_t nd = tensor.dim();
  EMBER_CHECK(dim >= -nd && dim < nd, "pad_across_processes: dim ", dim, " is out of range for shape ",
              tensor.shape());
  if (dim < 0) dim += nd;
  NoGradGuard no_grad;
  if (!pg || pg->size() == 1) return tensor.detach().clone();
  // Every process learns every shape, so all agree on the target (and a mismatch is caught).
  std::vector<int64_t> mine(tensor.shape().begin(), tensor.shape().end());
  Bytes blob(reinterpret_cast<const uint8_t*>(mine.data()),
             reinterpret_cast<const uint8_t*>(mine.data() + mine.size()));
  const std::vector<Bytes> all = pg->allgather_bytes(blob);
  int64_t longest = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    EMBER_CHECK(all[r].size() == blob.size(), "pad_across_processes: process ", r, " has a tensor with ",
                all[r].size() / sizeof(int64_t), " dims, process ", pg->rank(), " one with ", nd);
    std::vector<int64_t> shape(static_cast<size_t>(nd));
    std::memcpy(shape.data(), all[r].data(), all[r].size());
    for (int64_t d = 0; d < nd; ++d)
      EMBER_CHECK(d == dim || shape[size_t(d)] == mine[size_t(d)], "pad_across_processes: process ", r,
                  " has shape ", Shape(shape.begin(), shape.end()), " but process ", pg->rank(), " has ",
                  tensor.shape(), " (only dim ", dim, " may differ)");
    longest = std::max(longest, shape[size_t(dim)]);
  }
  const int64_t have = tensor.size(dim);
  if (have == longest) return tensor.detach().clone();
  Shape padded_shape = tensor.shape();
  padded_shape[size_t(dim)] = longest;
  Tensor out = full(padded_shape, pad_index, {.dtype = tensor.dtype(), .device = tensor.device()});
  out.narrow(dim, pad_first ? longest - have : 0, have).copy_(tensor.detach());
  return out;
}

Tensor broadcast(const Tensor& tensor, ProcessGroup* pg, int from) {
  EMBER_CHECK(tensor.defined(), "broadcast: the tensor is undefined");
  NoGradGuard no_grad;
  if (!pg || pg->size() == 1) {
    EMBER_CHECK(from == 0, "broadcast: process ", from, " does not exist in a job of 1 process");
    return tensor.detach().clone();
  }
  EMBER_CHECK(from >= 0 && from < pg->size(), "broadcast: process ", from, " does not exist in a job of ",
              pg->size(), " processes");
  Tensor wire = to_wire(tensor, *pg);
  pg->broadcast(wire, from)->wait();
  return from_wire(wire, tensor.device());
}

std::vector<Bytes> gather_object(const Bytes& mine, ProcessGroup* pg) {
  if (!pg || pg->size() == 1) return {mine};
  return pg->allgather_bytes(mine);
}

Bytes broadcast_object(const Bytes& value, ProcessGroup* pg, int from) {
  if (!pg || pg->size() == 1) {
    EMBER_CHECK(from == 0, "broadcast_object: process ", from, " does not exist in a job of 1 process");
    return value;
  }
  EMBER_CHECK(from >= 0 && from < pg->size(), "broadcast_object: process ", from, " does not exist in a job of ",
              pg->size(), " processes");
  // Only the sender's blob carries anything; the others send nothing.
  std::vector<Bytes> all = pg->allgather_bytes(pg->rank() == from ? value : Bytes{});
  return std::move(all[size_t(from)]);
}

std::vector<std::string> gather_object(const std::string& mine, ProcessGroup* pg) {
  std::vector<std::string> out;
  for (auto& b : gather_object(Bytes(mine.begin(), mine.end()), pg)) out.emplace_back(b.begin(), b.end());
  return out;
}

std::string broadcast_object(const std::string& value, ProcessGroup* pg, int from) {
  Bytes b = broadcast_object(Bytes(value.begin(), value.end()), pg, from);
  return std::string(b.begin(), b.end());
}

}  // namespace ember::distributed
