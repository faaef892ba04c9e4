// Can this machine hold the ranks `ember launch` is asked for? Checked before the first rank is
// forked, so a request that cannot fit fails at once, naming the limit and what to change,
// instead of forking ranks until the kernel refuses one and then stopping all those started.
#pragma once
#include "accelerate/launch_config.h"

namespace ember::cli {

// More local ranks than this for each CPU the launcher may use is taken for a mistake: a rank
// per CPU or per GPU is the usual, a few per CPU the most that still trains.
inline constexpr int kMaxRanksPerCpu = 64;

// Throws ember::Error unless the local ranks of `config` fit under kMaxRanksPerCpu, under the
// processes that can still be created (RLIMIT_NPROC where the kernel applies it, the control
// group's pids.max, kernel.threads-max and kernel.pid_max), and under the open-file limit
// (RLIMIT_NOFILE) for the pipes the launcher holds per rank (supervisor_descriptors).
void check_launch_limits(const distributed::LaunchConfig& config);

}  // namespace ember::cli
