#include "distributed/ddp.h"

#include <algorithm>
#include <sstream>

#include "core/grad_mode.h"

namespace ember::distributed {
namespace {

// One line per parameter and buffer: what must agree across ranks for the buckets (and the
// broadcasts) to line up.
struct Entry {
  std::string kind;  // "parameter" or "buffer"
  std::string name;
  std::string dtype;
  std::string shape;
  bool requires_grad = false;
};

Bytes encode(const std::vector<Entry>& entries) {
  std::ostringstream os;
  for (const auto& e : entries)
    os << e.kind << '\t' << e.name << '\t' << e.dtype << '\t' << e.shape << '\t' << (e.requires_grad ? 1 : 0) << '\n';
  const std::string s = os.str();
  return Bytes(s.begin(), s.end());
}

std::vector<Entry> decode(const Bytes& bytes) {
  std::vector<Entry> out;
  std::istringstream is(std::string(bytes.begin(), bytes.end()));
  std::string line;
  while (std::getline(is, line)) {
    std::vector<std::string> f;
    std::istringstream ls(line);
    std::string field;
    while (std::getline(ls, field, '\t')) f.push_back(field);
    EMBER_CHECK(f.size() == 5, "DistributedDataParallel: malformed model fingerprint from a peer");
    out.push_back(Entry{f[0], f[1], f[2], f[3], f[4] == "1"});
  }
  return out;
}

std::vector<Entry> describe(const nn::Module& model) {
  std::vector<Entry> out;
  auto add = [&](const char* kind, const std::string& name, const Tensor& t, bool rg) {
    out.push_back(Entry{kind, name, dtype_name(t.dtype()), detail::str_cat(t.shape()), rg});
  };
  for (const auto& [name, t] : model.named_parameters()) add("parameter", name, t, t.requires_grad());
  for (const auto& [name, t] : model.named_buffers()) add("buffer", name, t, false);
  return out;
}

// The first difference between rank 0's model and rank r's, as a sentence; empty if none.
std::string first_difference(const std::vector<Entry>& a, const std::vector<Entry>& b, int r) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const Entry& x = a[i];
    const Entry& y = b[i];
    if (x.kind != y.kind || x.name != y.name)
      return detail::str_cat(x.kind, " #", i, " is '", x.name, "' on rank 0 but ", y.kind, " '", y.name,
                             "' on rank ", r);
    if (x.shape != y.shape)
      return detail::str_cat(x.kind, " '", x.name, "' has shape ", x.shape, " on rank 0 but ", y.shape, " on rank ", r);
    if (x.dtype != y.dtype)
      return detail::str_cat(x.kind, " '", x.name, "' has dtype ", x.dtype, " on rank 0 but ", y.dtype, " on rank ", r);
    if (x.requires_grad != y.requires_grad)
      return detail::str_cat(x.kind, " '", x.name, "' ", x.requires_grad ? "requires" : "does not require",
                             " grad on rank 0 but ", y.requires_grad ? "requires" : "does not require", " it on rank ", r);
  }
  if (a.size() > n)
    return detail::str_cat(a[n].kind, " '", a[n].name, "' exists on rank 0 but not on rank ", r, " (", a.size(),
                           " parameters and buffers on rank 0, ", b.size(), " on rank ", r, ")");
  if (b.size() > n)
    return detail::str_cat(b[n].kind, " '", b[n].name, "' exists on rank ", r, " but not on rank 0 (", a.size(),
                           " parameters and buffers on rank 0, ", b.size(), " on rank ", r, ")");
  return {};
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> model, std::shared_ptr<ProcessGroup> pg,
                                                 DDPOptions options)
    : model_(std::move(model)), pg_(std::move(pg)), options_(options) {
  EMBER_CHECK(model_ != nullptr, "DistributedDataParallel: model is null");
  EMBER_CHECK(pg_ != nullptr, "DistributedDataParallel: process group is null");
  EMBER_CHECK(options_.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
              options_.bucket_cap_mb);
  verify_same_model_on_all_ranks();

  std::vector<Tensor> state;
  Reducer::NamedParameters trainable;
  for (auto& [name, t] : model_->named_parameters()) {
    state.push_back(t);
    if (t.requires_grad()) trainable.emplace_back(name, t);
  }
  for (auto& [name, t] : model_->named_buffers()) state.push_back(t);
  broadcast_from_rank0(state);

  reducer_ = Reducer::create(std::move(trainable), pg_,
                             ReducerOptions{options_.bucket_cap_mb, options_.find_unused_parameters,
                                            options_.gradient_as_bucket_view});
}

DistributedDataParallel::~DistributedDataParallel() {
  // The parameters outlive this wrapper: leave no hook of ours on them.
  if (reducer_) reducer_->remove_hooks();
}

void DistributedDataParallel::verify_same_model_on_all_ranks() {
  const std::vector<Entry> mine = describe(*model_);
  const std::vector<Bytes> all = pg_->allgather_bytes(encode(mine));
  EMBER_CHECK(int(all.size()) == pg_->size(), "DistributedDataParallel: fingerprint exchange returned ", all.size(),
              " entries for ", pg_->size(), " ranks");
  const std::vector<Entry> root = decode(all[0]);
  for (int r = 1; r < pg_->size(); ++r) {
    const std::string diff = first_difference(root, decode(all[size_t(r)]), r);
    EMBER_CHECK(diff.empty(), "DistributedDataParallel: ", diff,
                "; every rank must build the same model before wrapping it");
  }
}

void DistributedDataParallel::broadcast_from_rank0(const std::vector<Tensor>& tensors) {
  if (pg_->size() == 1 || tensors.empty()) return;
  NoGradGuard no_grad;
  // Collectives take contiguous tensors; a strided one travels through a copy.
  std::vector<std::pair<Tensor, Tensor>> staged;  // (target, contiguous carrier)
  std::vector<std::shared_ptr<Work>> works;
  for (const Tensor& t : tensors) {
    Tensor carrier = t.is_contiguous() ? t.detach() : t.contiguous();
    staged.emplace_back(t, carrier);
    works.push_back(pg_->broadcast(carrier, 0));
  }
  for (auto& w : works) w->wait();
  for (auto& [target, carrier] : staged)
    if (!target.is_contiguous()) Tensor(target).copy_(carrier);
}

void DistributedDataParallel::sync_buffers() {
  if (!options_.broadcast_buffers) return;
  std::vector<Tensor> buffers;
  for (auto& [name, t] : model_->named_buffers()) buffers.push_back(t);
  broadcast_from_rank0(buffers);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  sync_buffers();
  return model_->forward(x);
}

}  // namespace ember::distributed
