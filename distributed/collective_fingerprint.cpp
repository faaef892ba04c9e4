#include "distributed/collective_fingerprint.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "distributed/collective_checks.h"
#include "distributed/process_group.h"

namespace ember::distributed {
namespace {

// Encoded layout: magic, kind, seq, dtype, extra, numel, ndim, dims...
// The magic tells a fingerprint from payload bytes of a rank that skipped the exchange.
constexpr int64_t kMagic = 0x454d4246;  // "EMBF"

bool same_payload(const CollectiveFingerprint& a, const CollectiveFingerprint& b) {
  switch (a.kind) {
    case CollectiveKind::allreduce:
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce_scatter:
      return a.numel == b.numel && a.dtype == b.dtype && a.extra == b.extra;
    case CollectiveKind::allgather_into:
      return a.numel == b.numel && a.dtype == b.dtype;
    case CollectiveKind::allgather:  // checked by allgather_mismatch, whose message says more
    case CollectiveKind::barrier:
    case CollectiveKind::allgather_bytes:
      return true;
  }
  return true;
}

// What follows "rank r " in a same-kind mismatch: the fingerprint without its kind and number.
std::string payload(const CollectiveFingerprint& f) {
  std::string s = detail::str_cat(f.shape, " ", dtype_name(f.dtype));
  if (f.kind == CollectiveKind::allreduce || f.kind == CollectiveKind::reduce_scatter)
    s += std::string(" ") + reduce_op_name(ReduceOp(f.extra));
  if (f.kind == CollectiveKind::broadcast) s += " from root " + std::to_string(f.extra);
  return s;
}

}  // namespace

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::allreduce: return "allreduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::allgather: return "allgather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::allgather_into: return "allgather_into";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::allgather_bytes: return "allgather_bytes";
  }
  return "an unknown collective";
}

std::vector<int64_t> CollectiveFingerprint::encode() const {
  std::vector<int64_t> out(kEncodedSize, 0);
  out[0] = kMagic;
  out[1] = int64_t(kind);
  out[2] = int64_t(seq);
  out[3] = int64_t(dtype);
  out[4] = extra;
  out[5] = numel;
  out[6] = int64_t(shape.size());
  for (size_t d = 0; d < std::min(shape.size(), kFingerprintDims); ++d) out[7 + d] = shape[d];
  return out;
}

CollectiveFingerprint CollectiveFingerprint::decode(const int64_t* e) {
  CollectiveFingerprint f;
  if (e[0] != kMagic) {
    f.kind = CollectiveKind(0);  // named "an unknown collective" by describe()
    return f;
  }
  f.kind = CollectiveKind(e[1]);
  f.seq = uint64_t(e[2]);
  f.dtype = DType(e[3]);
  f.extra = e[4];
  f.numel = e[5];
  const size_t ndim = std::min<size_t>(size_t(std::max<int64_t>(e[6], 0)), kFingerprintDims);
  f.shape.assign(e + 7, e + 7 + ndim);
  return f;
}

std::string CollectiveFingerprint::describe() const {
  std::string s = detail::str_cat(collective_kind_name(kind), " #", seq);
  if (kind == CollectiveKind(0)) return "no fingerprinted collective (its fingerprints are off, or it runs another build)";
  if (kind == CollectiveKind::barrier) return s;
  if (kind == CollectiveKind::allgather_bytes) return detail::str_cat(s, " (", numel, " bytes)");
  return s + " " + payload(*this);
}

std::optional<std::string> fingerprint_mismatch(const std::string& where, const std::vector<CollectiveFingerprint>& all) {
  if (all.empty()) return std::nullopt;
  const CollectiveFingerprint& first = all.front();
  bool same_call = true;
  for (const auto& f : all) same_call = same_call && f.kind == first.kind && f.seq == first.seq;
  if (!same_call) {
    std::string msg = where + ": the ranks called different collectives: ";
    for (size_t r = 0; r < all.size(); ++r)
      msg += detail::str_cat(r ? ", rank " : "rank ", r, r ? " in " : " is in ", all[r].describe());
    return msg + " (a collective called on some ranks only, e.g. under is_main_process, or in a different order)";
  }
  if (first.kind == CollectiveKind::allgather) {
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    for (const auto& f : all) shapes.push_back(f.shape), dtypes.push_back(f.dtype);
    return allgather_mismatch(where, first.shape, first.dtype, shapes, dtypes);
  }
  bool same = true;
  for (const auto& f : all) same = same && same_payload(first, f);
  if (same) return std::nullopt;
  std::string msg = detail::str_cat(where, ": the ranks called ", collective_kind_name(first.kind), " #", first.seq,
                                    " with different tensors: ");
  for (size_t r = 0; r < all.size(); ++r) msg += detail::str_cat(r ? ", " : "", "rank ", r, " ", payload(all[r]));
  return msg;
}

bool collective_fingerprints_enabled_by_env() {
  const char* v = std::getenv("EMBER_COLLECTIVE_FINGERPRINT");
  if (!v || !*v) return true;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s == "1" || s == "on" || s == "true") return true;
  if (s == "0" || s == "off" || s == "false") return false;
  EMBER_FAIL("EMBER_COLLECTIVE_FINGERPRINT='", v, "' is not understood (use 1/on or 0/off)");
}

}  // namespace ember::distributed
