// Slurm's compressed host and task lists, as srun and sbatch write them into the environment
// (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST, SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE).
//
//   expand_slurm_nodelist("gpu[01-03,07],login-1.cluster")
//     -> {"gpu01", "gpu02", "gpu03", "gpu07", "login-1.cluster"}
//   expand_slurm_nodelist("rack[1-2]n[3-4]") -> {"rack1n3", "rack1n4", "rack2n3", "rack2n4"}
//   expand_slurm_tasks_per_node("2(x3),1") -> {2, 2, 2, 1}
#pragma once
#include <string>
#include <vector>

namespace ember::distributed {

// Host names in Slurm's order. A list is comma-separated items; an item is a host name whose
// bracket groups ("[01-04,07]") each expand to their numbers, several groups in one name giving
// every combination (the first group varying slowest). A range keeps the width of its lower
// bound ("[08-10]" -> 08 09 10). Empty items, unmatched or nested brackets, reversed ranges,
// characters other than letters, digits, '-', '.' and '_' outside brackets, and lists of more
// than a million hosts are an ember::Error naming `variable` and the value.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist,
                                               const std::string& variable = "SLURM_JOB_NODELIST");

// Tasks on each node, one entry per node: comma-separated counts, "N(xM)" standing for M nodes
// of N tasks. A count must be at least 1; anything else is an ember::Error naming `variable`
// and the value.
std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks_per_node,
                                             const std::string& variable = "SLURM_TASKS_PER_NODE");

}  // namespace ember::distributed
