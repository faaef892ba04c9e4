// EMBER_DISTRIBUTED_DEBUG, the twin of TORCH_DISTRIBUTED_DEBUG: OFF (or unset, or 0), INFO (data
// parallel prints its gradient order and bucket layout once), DETAIL (also a line per
// synchronised pass with its communication time and hidden fraction, and every collective checks
// that the ranks agree on sizes and dtypes; 1 is kept as a synonym).
#pragma once

namespace ember::distributed {

enum class DebugLevel { Off, Info, Detail };

// Reads the variable each call; an unknown value is an ember::Error naming it.
DebugLevel debug_level();

}  // namespace ember::distributed
