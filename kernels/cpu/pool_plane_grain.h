// How many planes one pooling task takes, shared by the pooling kernels (kernels/cpu/pooling.cpp
// and its 2x2 and global fast paths) so that every path splits work among threads alike.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/native/pooling.h"

namespace ember::cpu {

// Planes per task: enough elements that a task outweighs handing it to a thread.
inline int64_t pool_plane_grain(const native::Pool2dGeometry& g) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, g.in_h * g.in_w + g.out_h * g.out_w));
}

}  // namespace ember::cpu
