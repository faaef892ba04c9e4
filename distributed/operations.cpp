#include "distributed/operations.h"

#include <algorithm>
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

// Gather and broadcast only move bytes, so bool tensors (which the backends do not take) travel
// as i32 and come back as bool.
Tensor to_wire_data(const Tensor& t, const ProcessGroup& pg) {
  Tensor w = to_wire(t, pg);
  return w.dtype() == DType::boolean ? w.to(DType::i32) : w;
}
Tensor from_wire_data(const Tensor& t, const Tensor& like) {
  return from_wire(t.dtype() == like.dtype() ? t : t.to(like.dtype()), like.device());
}

// ---- structures: shapes exchanged once, data packed into one buffer per dtype

std::string proc(int rank) { return "process " + std::to_string(rank); }

// What each process says about its tensors: dtype and shape of each, in leaf order.
struct LeafInfo {
  DType dtype = DType::f32;
  Shape shape;
};

Bytes encode_infos(const std::vector<Tensor>& tensors) {
  std::vector<int64_t> words{int64_t(tensors.size())};
  for (const auto& t : tensors) {
    words.push_back(int64_t(t.dtype()));
    words.push_back(t.dim());
    words.insert(words.end(), t.shape().begin(), t.shape().end());
  }
  return Bytes(reinterpret_cast<const uint8_t*>(words.data()), reinterpret_cast<const uint8_t*>(words.data() + words.size()));
}

std::vector<LeafInfo> decode_infos(const Bytes& blob, const char* op, int rank) {
  const size_t n_words = blob.size() / sizeof(int64_t);
  std::vector<int64_t> words(n_words);
  if (n_words) std::memcpy(words.data(), blob.data(), n_words * sizeof(int64_t));
  size_t at = 0;
  auto next = [&]() {
    EMBER_CHECK(at < n_words && blob.size() % sizeof(int64_t) == 0, op, ": ", proc(rank),
                " sent a malformed description of its tensors");
    return words[at++];
  };
  const int64_t count = next();
  EMBER_CHECK(count >= 0 && size_t(count) <= n_words, op, ": ", proc(rank), " sent a malformed description of its tensors");
  std::vector<LeafInfo> out(static_cast<size_t>(count));
  for (auto& info : out) {
    info.dtype = DType(next());
    const int64_t nd = next();
    EMBER_CHECK(nd >= 0 && size_t(nd) <= n_words, op, ": ", proc(rank), " sent a malformed description of its tensors");
    info.shape.resize(static_cast<size_t>(nd));
    for (auto& d : info.shape) d = next();
  }
  return out;
}

// Every process's LeafInfos, in rank order (one allgather); every process must pass as many
// tensors as this one.
std::vector<std::vector<LeafInfo>> exchange_infos(const char* op, const std::vector<Tensor>& tensors,
                                                  ProcessGroup& pg) {
  const std::vector<Bytes> all = pg.allgather_bytes(encode_infos(tensors));
  std::vector<std::vector<LeafInfo>> out;
  for (size_t r = 0; r < all.size(); ++r) {
    out.push_back(decode_infos(all[r], op, int(r)));
    EMBER_CHECK(out.back().size() == tensors.size(), op, ": ", proc(int(r)), " passes ", out.back().size(),
                " tensors but ", proc(pg.rank()), " passes ", tensors.size(),
                " (every process must pass the same structure)");
  }
  return out;
}

// Leaves that share a dtype and a wire device travel as one buffer; groups in order of first
// appearance, so every process (passing the same structure) forms the same groups.
struct Group {
  DType dtype;
  Device device;
  std::vector<size_t> members;
};

std::vector<Group> group_by_dtype(const std::vector<Tensor>& wire) {
  std::vector<Group> groups;
  for (size_t i = 0; i < wire.size(); ++i) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return x.dtype == wire[i].dtype() && x.device == wire[i].device();
    });
    if (g == groups.end()) {
      groups.push_back({wire[i].dtype(), wire[i].device(), {}});
      g = groups.end() - 1;
    }
    g->members.push_back(i);
  }
  return groups;
}

// The group's leaves (flattened wire tensors) back to back.
Tensor pack(const Group& g, const std::vector<Tensor>& flat) {
  std::vector<Tensor> parts;
  for (size_t i : g.members) parts.push_back(flat[i]);
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

// Splits a packed buffer back into tensors of `shapes` (the group's members, in order).
std::vector<Tensor> unpack(const Tensor& buffer, const std::vector<Shape>& shapes) {
  std::vector<Tensor> out;
  int64_t at = 0;
  for (const auto& shape : shapes) {
    const int64_t n = numel_of(shape);
    out.push_back(buffer.narrow(0, at, n).reshape(shape));
    at += n;
  }
  return out;
}

void check_defined(const char* op, const TensorLeaves& leaves) {
  for (size_t i = 0; i < leaves.tensors.size(); ++i)
    EMBER_CHECK(leaves.tensors[i].defined(), op, ": ", leaves.names[i], " is undefined");
}

}  // namespace

namespace detail {

std::vector<Tensor> gather_leaves(const TensorLeaves& leaves, ProcessGroup* pg) {
  check_defined("gather", leaves);
  NoGradGuard no_grad;
  const size_t n = leaves.tensors.size();
  std::vector<Tensor> rows(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = leaves.tensors[i];
    rows[i] = t.dim() == 0 ? t.reshape({1}) : t;
  }
  if (!pg || pg->size() == 1) {
    for (size_t i = 0; i < n; ++i) out[i] = rows[i].detach().clone();
    return out;
  }
  const auto infos = exchange_infos("gather", rows, *pg);
  const int me = pg->rank();
  for (size_t r = 0; r < infos.size(); ++r)
    for (size_t i = 0; i < n; ++i) {
      const LeafInfo& theirs = infos[r][i];
      EMBER_CHECK(theirs.dtype == rows[i].dtype(), "gather: ", leaves.names[i], " is ", dtype_name(theirs.dtype),
                  " on ", proc(int(r)), " but ", dtype_name(rows[i].dtype()), " on ", proc(me));
      bool same = theirs.shape.size() == rows[i].shape().size();
      for (size_t d = 1; same && d < theirs.shape.size(); ++d) same = theirs.shape[d] == rows[i].shape()[d];
      EMBER_CHECK(same, "gather: ", leaves.names[i], " has shape ", theirs.shape, " on ", proc(int(r)), " but ",
                  rows[i].shape(), " on ", proc(me), " (only dim 0 may differ)");
    }
  std::vector<Tensor> flat(n);
  for (size_t i = 0; i < n; ++i) flat[i] = to_wire_data(rows[i], *pg).reshape({-1});
  std::vector<std::vector<Tensor>> pieces(n, std::vector<Tensor>(infos.size()));
  for (const Group& g : group_by_dtype(flat)) {
    int64_t total = 0;
    for (const auto& theirs : infos)
      for (size_t i : g.members) total += numel_of(theirs[i].shape);
    std::vector<Tensor> parts;
    if (total > 0) {
      parts = pg->allgather(pack(g, flat));
    } else {  // nothing anywhere: no transfer
      parts.assign(infos.size(), empty({0}, {.dtype = g.dtype, .device = g.device}));
    }
    for (size_t r = 0; r < infos.size(); ++r) {
      std::vector<Shape> shapes;
      for (size_t i : g.members) shapes.push_back(infos[r][i].shape);
      const std::vector<Tensor> mine = unpack(parts[r], shapes);
      for (size_t k = 0; k < g.members.size(); ++k) pieces[g.members[k]][r] = mine[k];
    }
  }
  for (size_t i = 0; i < n; ++i) out[i] = from_wire_data(cat(pieces[i], 0), leaves.tensors[i]);
  return out;
}

std::vector<Tensor> reduce_leaves(const TensorLeaves& leaves, const std::string& reduction, ProcessGroup* pg,
                                  double scale) {
  check_defined("reduce", leaves);
  EMBER_CHECK(reduction == "sum" || reduction == "mean", "reduce: reduction must be 'sum' or 'mean', got '",
              reduction, "'");
  const size_t n = leaves.tensors.size();
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = leaves.tensors[i];
    EMBER_CHECK(reduction != "mean" || t.is_floating_point(), "reduce: 'mean' needs floating-point tensors, but ",
                leaves.names[i], " is ", dtype_name(t.dtype()), " (reduce with 'sum' and divide)");
    EMBER_CHECK(scale == 1.0 || t.is_floating_point(), "reduce: scale ", scale,
                " needs floating-point tensors, but ", leaves.names[i], " is ", dtype_name(t.dtype()));
  }
  NoGradGuard no_grad;
  std::vector<Tensor> out(n);
  if (!pg || pg->size() == 1) {
    for (size_t i = 0; i < n; ++i) out[i] = leaves.tensors[i].detach().clone();
  } else {
    std::vector<Tensor> flat(n);
    for (size_t i = 0; i < n; ++i) flat[i] = to_wire(leaves.tensors[i], *pg).reshape({-1});
    for (const Group& g : group_by_dtype(flat)) {
      Tensor buffer = pack(g, flat);  // to_wire copied: the caller's tensors stay as they are
      pg->allreduce(buffer, reduction == "mean" ? ReduceOp::Avg : ReduceOp::Sum)->wait();
      std::vector<Shape> shapes;
      for (size_t i : g.members) shapes.push_back(leaves.tensors[i].shape());
      const std::vector<Tensor> back = unpack(buffer, shapes);
      for (size_t k = 0; k < g.members.size(); ++k)
        out[g.members[k]] = from_wire(back[k], leaves.tensors[g.members[k]].device());
    }
  }
  if (scale != 1.0)
    for (auto& t : out) t = t * scale;
  return out;
}

std::vector<Tensor> broadcast_leaves(const TensorLeaves& leaves, ProcessGroup* pg, int from) {
  check_defined("broadcast", leaves);
  NoGradGuard no_grad;
  const size_t n = leaves.tensors.size();
  std::vector<Tensor> out(n);
  if (!pg || pg->size() == 1) {
    EMBER_CHECK(from == 0, "broadcast: process ", from, " does not exist in a job of 1 process");
    for (size_t i = 0; i < n; ++i) out[i] = leaves.tensors[i].detach().clone();
    return out;
  }
  EMBER_CHECK(from >= 0 && from < pg->size(), "broadcast: process ", from, " does not exist in a job of ",
              pg->size(), " processes");
  std::vector<Tensor> flat(n);
  for (size_t i = 0; i < n; ++i) flat[i] = to_wire_data(leaves.tensors[i], *pg).reshape({-1});
  for (const Group& g : group_by_dtype(flat)) {
    Tensor buffer = pack(g, flat);
    pg->broadcast(buffer, from)->wait();
    std::vector<Shape> shapes;
    for (size_t i : g.members) shapes.push_back(leaves.tensors[i].shape());
    const std::vector<Tensor> back = unpack(buffer, shapes);
    for (size_t k = 0; k < g.members.size(); ++k) out[g.members[k]] = from_wire_data(back[k], leaves.tensors[g.members[k]]);
  }
  return out;
}

std::vector<Tensor> pad_leaves(const TensorLeaves& leaves, ProcessGroup* pg, int64_t dim, double pad_index,
                               bool pad_first) {
  check_defined("pad_across_processes", leaves);
  NoGradGuard no_grad;
  const size_t n = leaves.tensors.size();
  std::vector<Tensor> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = leaves.tensors[i].detach().clone();
  if (!pg || pg->size() == 1) return out;
  // Every process learns every shape, so all agree on the target size along `dim`.
  const auto infos = exchange_infos("pad_across_processes", leaves.tensors, *pg);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = leaves.tensors[i];
    const int64_t nd = t.dim();
    for (size_t r = 0; r < infos.size(); ++r)
      EMBER_CHECK(int64_t(infos[r][i].shape.size()) == nd, "pad_across_processes: ", leaves.names[i], " has ",
                  infos[r][i].shape.size(), " dims (shape ", infos[r][i].shape, ") on ", proc(int(r)), " but ", nd,
                  " (shape ", t.shape(), ") on ", proc(pg->rank()));
    if (dim < -nd || dim >= nd) continue;  // no such dim: left as it is
    const int64_t d = dim < 0 ? dim + nd : dim;
    int64_t longest = 0;
    for (const auto& theirs : infos) longest = std::max(longest, theirs[i].shape[size_t(d)]);
    const int64_t have = t.size(d);
    if (have == longest) continue;
    Shape padded_shape = t.shape();
    padded_shape[size_t(d)] = longest;
    Tensor padded = full(padded_shape, pad_index, {.dtype = t.dtype(), .device = t.device()});
    padded.narrow(d, pad_first ? longest - have : 0, have).copy_(t.detach());
    out[i] = padded;
  }
  return out;
}

}  // namespace detail

Tensor gather(const Tensor& tensor, ProcessGroup* pg) {
  EMBER_CHECK(tensor.defined(), "gather: the tensor is undefined");
  NoGradGuard no_grad;
  Tensor rows = tensor.dim() == 0 ? tensor.reshape({1}) : tensor;
  if (!pg || pg->size() == 1) return rows.detach().clone();
  std::vector<Tensor> parts = pg->allgather(to_wire_data(rows, *pg));
  return from_wire_data(cat(parts, 0), tensor);
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
  return detail::pad_leaves({{tensor}, {"the tensor"}}, pg, dim, pad_index, pad_first)[0];
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
  Tensor wire = to_wire_data(tensor, *pg);
  pg->broadcast(wire, from)->wait();
  return from_wire_data(wire, tensor);
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
