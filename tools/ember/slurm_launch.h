// `ember launch` as a task of an srun step, one launcher per node, as an sbatch script starts
// it (`srun --ntasks-per-node=1 ember launch --num_processes 8 train`): the machine count, this
// machine's rank and the main machine's address and port come from Slurm (see
// distributed/rendezvous.h), unless a flag or the config file's own value for a job of several
// machines says otherwise.
#pragma once
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "accelerate/launch_config.h"

namespace ember::cli {

// `flags_given` holds the normalised names of the flags on the command line. Outside an srun
// step nothing changes. Several launchers on one node of the step are an ember::Error (each
// would start the same ranks).
void apply_slurm_machine_settings(distributed::LaunchConfig& config, const std::set<std::string>& flags_given,
                                  const std::function<std::optional<std::string>(const std::string&)>& lookup);

}  // namespace ember::cli
