// When an elementwise kernel writes its output with non-temporal stores (past the caches).
// An output this large, written next to an input as large, outgrows a 16 MiB L3 before the op
// ends, so a consumer would find its first lines gone anyway; streaming it saves the read for
// ownership each ordinary store of a missing line costs (about a fifth of the time of the gelu
// and dropout loops at 4M f32 elements). Smaller outputs stay in cache for the next op.
#pragma once
#include <cstdint>

namespace ember::cpu {

constexpr int64_t kStreamedOutputMinBytes = int64_t(8) << 20;

inline bool stream_output(int64_t bytes) { return bytes >= kStreamedOutputMinBytes; }

}  // namespace ember::cpu
