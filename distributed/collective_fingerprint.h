// What a rank is about to run, as every rank compares it before a collective: the operation,
// its sequence number in the group, the dtype and shape, and the reduce op or root. Encoded
// as a fixed number of int64s, so ranks that are in *different* collectives still exchange
// the same bytes and can tell each other which one they are in ("rank 0 is in allgather #812
// [37, 2] float32, rank 1 in barrier #812"), instead of hanging until the timeout.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace ember::distributed {

enum class CollectiveKind : int64_t {
  allreduce = 1,
  broadcast,
  allgather,
  reduce_scatter,
  allgather_into,
  barrier,
  allgather_bytes,
};

const char* collective_kind_name(CollectiveKind kind);

struct CollectiveFingerprint {
  CollectiveKind kind = CollectiveKind::barrier;
  uint64_t seq = 0;  // collectives this group ran before this one: equal on every rank
  DType dtype = DType::f32;  // unused by barrier and allgather_bytes
  Shape shape;        // up to kFingerprintDims dims are kept; numel is always exact
  int64_t numel = 0;
  int64_t extra = 0;  // the ReduceOp (allreduce, reduce_scatter) or the root (broadcast)

  static constexpr size_t kFingerprintDims = 16;
  static constexpr size_t kEncodedSize = 7 + kFingerprintDims;

  std::vector<int64_t> encode() const;
  // The fingerprint in slot `r` of a gathered buffer of every rank's encode().
  static CollectiveFingerprint decode(const int64_t* encoded);
  // "allgather #812 [37, 2] float32", "allreduce #3 [4] float32 sum", "barrier #9".
  std::string describe() const;
};

// nullopt when every rank may run `all` together; otherwise the reason, naming every rank's
// fingerprint. `where` prefixes the message ("allreduce (world 2, rank 0)"). Different kinds
// or sequence numbers never match; the same kind must agree on what it moves (allgather's
// dim 0 and allgather_bytes' length may differ between ranks).
std::optional<std::string> fingerprint_mismatch(const std::string& where, const std::vector<CollectiveFingerprint>& all);

// Whether collectives exchange fingerprints by default: on, unless EMBER_COLLECTIVE_FINGERPRINT
// is 0 / off / false (a malformed value is an ember::Error naming it).
bool collective_fingerprints_enabled_by_env();

}  // namespace ember::distributed
