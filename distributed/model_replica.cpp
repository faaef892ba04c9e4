#include "distributed/model_replica.h"

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

std::vector<Entry> decode(const Bytes& bytes, const char* who) {
  std::vector<Entry> out;
  std::istringstream is(std::string(bytes.begin(), bytes.end()));
  std::string line;
  while (std::getline(is, line)) {
    std::vector<std::string> f;
    std::istringstream ls(line);
    std::string field;
    while (std::getline(ls, field, '\t')) f.push_back(field);
    EMBER_CHECK(f.size() == 5, who, ": malformed model fingerprint from a peer");
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

void verify_same_model_on_all_ranks(const nn::Module& model, ProcessGroup& pg, const char* who) {
  const std::vector<Entry> mine = describe(model);
  const std::vector<Bytes> all = pg.allgather_bytes(encode(mine));
  EMBER_CHECK(int(all.size()) == pg.size(), who, ": fingerprint exchange returned ", all.size(),
              " entries for ", pg.size(), " ranks");
  const std::vector<Entry> root = decode(all[0], who);
  for (int r = 1; r < pg.size(); ++r) {
    const std::string diff = first_difference(root, decode(all[size_t(r)], who), r);
    EMBER_CHECK(diff.empty(), who, ": ", diff,
                "; every rank must build the same model before wrapping it");
  }
}

void broadcast_from_rank0(ProcessGroup& pg, const std::vector<Tensor>& tensors) {
  if (pg.size() == 1 || tensors.empty()) return;
  NoGradGuard no_grad;
  // Collectives take contiguous tensors; a strided one travels through a copy.
  std::vector<std::pair<Tensor, Tensor>> staged;  // (target, contiguous carrier)
  std::vector<std::shared_ptr<Work>> works;
  for (const Tensor& t : tensors) {
    Tensor carrier = t.is_contiguous() ? t.detach() : t.contiguous();
    staged.emplace_back(t, carrier);
    works.push_back(pg.broadcast(carrier, 0));
  }
  for (auto& w : works) w->wait();
  for (auto& [target, carrier] : staged)
    if (!target.is_contiguous()) Tensor(target).copy_(carrier);
}

}  // namespace ember::distributed
