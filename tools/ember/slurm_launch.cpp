#include "slurm_launch.h"

#include "core/error.h"
#include "distributed/rendezvous.h"

namespace ember::cli {

void apply_slurm_machine_settings(distributed::LaunchConfig& config, const std::set<std::string>& flags_given,
                                  const std::function<std::optional<std::string>(const std::string&)>& lookup) {
  // The launcher's own variables: Slurm's, unless something launched the launcher (then the
  // machine layout is that launcher's business, given by flags).
  if (lookup("RANK") || lookup("EMBER_LAUNCHED_BY")) return;
  const distributed::RendezvousInfo step = distributed::rendezvous_info_from(lookup);
  if (step.started_by != "Slurm") return;
  EMBER_CHECK(step.local_world_size == 1, "ember launch: srun started ", step.local_world_size,
              " launchers on this node (SLURM_LOCALID=", step.local_rank,
              "); start one per node (srun --ntasks-per-node=1 ember launch ...), each starts the node's ranks");
  auto given = [&](const char* flag) { return flags_given.count(flag) > 0; };
  if (!given("num_machines")) config.num_machines = step.world_size;
  if (!given("machine_rank")) config.machine_rank = step.rank;
  // On one node the ranks meet on loopback, as without Slurm.
  if (!given("main_process_ip") && config.num_machines > 1) config.main_process_ip = step.master_addr;
  if (!given("main_process_port") && step.master_port > 0) config.main_process_port = step.master_port;
}

}  // namespace ember::cli
