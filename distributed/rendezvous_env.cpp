// Who this process is, from the variables its launcher set: `ember launch` / torchrun, MPI's
// mpirun, or Slurm's srun (rendezvous.h says which wins and why).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "core/error.h"
#include "distributed/rendezvous.h"
#include "distributed/slurm_nodelist.h"

namespace ember::distributed {

namespace {

using Lookup = std::function<std::optional<std::string>(const std::string&)>;

long long parse_integer(const std::string& name, const std::string& value) {
  long long out = 0;
  const char* first = value.data();
  const char* last = first + value.size();
  auto [ptr, ec] = std::from_chars(first, last, out);
  EMBER_CHECK(ec == std::errc() && ptr == last && first != last, "rendezvous: ", name, "='", value,
              "' is not an integer");
  return out;
}

int parse_int(const std::string& name, const std::string& value) {
  const long long v = parse_integer(name, value);
  EMBER_CHECK(v >= -(1LL << 31) && v < (1LL << 31), "rendezvous: ", name, "='", value,
              "' is not an integer that fits an int");
  return static_cast<int>(v);
}

// The first of `names` that is set, as (name, value).
std::optional<std::pair<std::string, std::string>> first_set(const Lookup& lookup,
                                                             const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (auto v = lookup(n)) return std::make_pair(n, *v);
  return std::nullopt;
}

// Both variables of a pair, or neither; one alone is an error naming both.
bool pair_set(const Lookup& lookup, const std::string& a, const std::string& b, const std::string& who) {
  auto va = lookup(a), vb = lookup(b);
  if (va.has_value() != vb.has_value()) {
    const std::string& set = va ? a : b;
    const std::string& unset = va ? b : a;
    EMBER_FAIL("rendezvous: ", set, "='", va ? *va : *vb, "' is set but ", unset, " is not (", a, " and ", b,
               " go together, as ", who, " sets them)");
  }
  return va.has_value();
}

void check_rank(RendezvousInfo& info, const std::string& rank_name, const std::string& size_name) {
  EMBER_CHECK(info.world_size >= 1, "rendezvous: ", size_name, "='", info.world_size, "' must be at least 1");
  EMBER_CHECK(info.rank >= 0 && info.rank < info.world_size, "rendezvous: ", rank_name, "='", info.rank,
              "' is out of range for ", size_name, "=", info.world_size, " (0..", info.world_size - 1, ")");
}

void check_local(RendezvousInfo& info, const std::string& local_name, const std::string& local_size_name,
                 const std::string& size_name) {
  EMBER_CHECK(info.local_world_size >= 1 && info.local_world_size <= info.world_size, "rendezvous: ",
              local_size_name, "='", info.local_world_size, "' must be in 1..", size_name, "=", info.world_size,
              " (the number of ranks)");
  EMBER_CHECK(info.local_rank >= 0 && info.local_rank < info.local_world_size, "rendezvous: ", local_name, "='",
              info.local_rank, "' is out of range for ", local_size_name, "=", info.local_world_size, " (0..",
              info.local_world_size - 1, ")");
}

void read_master_port(RendezvousInfo& info, const std::string& value) {
  const long long p = parse_integer("MASTER_PORT", value);
  EMBER_CHECK(p >= 1 && p <= 65535, "rendezvous: MASTER_PORT='", value, "' is not a port number (1..65535)");
  info.master_port = static_cast<int>(p);
}

void read_master_addr(RendezvousInfo& info, const std::string& value) {
  EMBER_CHECK(!value.empty(), "rendezvous: MASTER_ADDR is set but empty");
  info.master_addr = value;
}

// RANK/WORLD_SIZE/LOCAL_*/MASTER_*: `ember launch`, torchrun, or by hand.
RendezvousInfo from_rank_variables(const Lookup& lookup) {
  const std::string who = "`ember launch` or torchrun";
  RendezvousInfo info;
  const bool have_ranks = pair_set(lookup, "RANK", "WORLD_SIZE", who);
  const bool have_local = pair_set(lookup, "LOCAL_RANK", "LOCAL_WORLD_SIZE", who);
  if (have_ranks) {
    info.started_by = "RANK/WORLD_SIZE";
    info.world_size = parse_int("WORLD_SIZE", *lookup("WORLD_SIZE"));
    info.rank = parse_int("RANK", *lookup("RANK"));
    check_rank(info, "RANK", "WORLD_SIZE");
  } else if (have_local) {
    EMBER_FAIL("rendezvous: LOCAL_RANK='", *lookup("LOCAL_RANK"),
               "' is set but RANK and WORLD_SIZE are not (set all of them, or none for a single process)");
  }
  if (have_local) {
    info.local_world_size = parse_int("LOCAL_WORLD_SIZE", *lookup("LOCAL_WORLD_SIZE"));
    info.local_rank = parse_int("LOCAL_RANK", *lookup("LOCAL_RANK"));
    check_local(info, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE");
  } else {
    // No launcher told us about machines: all ranks share this one.
    info.local_world_size = info.world_size;
    info.local_rank = info.rank;
  }
  auto addr = lookup("MASTER_ADDR");
  auto port = lookup("MASTER_PORT");
  if (info.world_size > 1) {
    EMBER_CHECK(addr, "rendezvous: WORLD_SIZE=", info.world_size,
                " but MASTER_ADDR is not set (the address of the machine running rank 0)");
    EMBER_CHECK(port, "rendezvous: WORLD_SIZE=", info.world_size,
                " but MASTER_PORT is not set (a free port on the machine running rank 0)");
  }
  if (addr) read_master_addr(info, *addr);
  if (port) read_master_port(info, *port);
  return info;
}

// A hash that is the same on every machine, whatever its standard library.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// mpirun: Open MPI's OMPI_COMM_WORLD_* or MPICH's PMI_* (Hydra).
std::optional<RendezvousInfo> from_mpi(const Lookup& lookup) {
  struct Names {
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
    const char* who;
  };
  const Names flavours[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
       "Open MPI's mpirun"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MPICH's mpiexec"},
  };
  for (const Names& n : flavours) {
    if (!pair_set(lookup, n.rank, n.size, n.who)) continue;
    RendezvousInfo info;
    info.started_by = "MPI";
    info.rank = parse_int(n.rank, *lookup(n.rank));
    info.world_size = parse_int(n.size, *lookup(n.size));
    check_rank(info, n.rank, n.size);
    if (pair_set(lookup, n.local_rank, n.local_size, n.who)) {
      info.local_rank = parse_int(n.local_rank, *lookup(n.local_rank));
      info.local_world_size = parse_int(n.local_size, *lookup(n.local_size));
      check_local(info, n.local_rank, n.local_size, n.size);
    } else {
      info.local_rank = info.rank;
      info.local_world_size = info.world_size;
    }
    if (auto addr = lookup("MASTER_ADDR")) {
      read_master_addr(info, *addr);
    } else {
      // Every rank on this machine: the store is local. Across machines nobody here knows
      // which host runs rank 0.
      EMBER_CHECK(info.local_world_size == info.world_size || info.world_size == 1, "rendezvous: started by ",
                  n.who, " with ", info.world_size, " ranks, ", info.local_world_size,
                  " of them on this machine, but MASTER_ADDR is not set: pass the address of the machine "
                  "running rank 0 (mpirun -x MASTER_ADDR=host)");
      info.master_addr = "127.0.0.1";
    }
    if (auto port = lookup("MASTER_PORT")) {
      read_master_port(info, *port);
    } else if (info.world_size > 1) {
      // The job's id is the same on every rank and differs between concurrent jobs.
      auto job = first_set(lookup, {"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE",
                                    "PMI_JOBID", "PMI_KVSNAME"});
      EMBER_CHECK(job, "rendezvous: started by ", n.who,
                  " but neither MASTER_PORT nor the MPI job's id is set (pass mpirun -x MASTER_PORT=port)");
      info.master_port = 20000 + static_cast<int>(fnv1a(job->second) % 10000);
    }
    return info;
  }
  return std::nullopt;
}

// srun: only inside a job step (SLURM_STEP_ID); an sbatch script itself is one process.
std::optional<RendezvousInfo> from_slurm(const Lookup& lookup) {
  if (!first_set(lookup, {"SLURM_STEP_ID", "SLURM_STEPID"})) return std::nullopt;
  auto procid = lookup("SLURM_PROCID");
  auto ntasks = first_set(lookup, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
  if (!procid || !ntasks) return std::nullopt;
  RendezvousInfo info;
  info.started_by = "Slurm";
  info.rank = parse_int("SLURM_PROCID", *procid);
  info.world_size = parse_int(ntasks->first, ntasks->second);
  check_rank(info, "SLURM_PROCID", ntasks->first);

  const auto localid = lookup("SLURM_LOCALID");
  const auto nodeid = lookup("SLURM_NODEID");
  info.local_rank = localid ? parse_int("SLURM_LOCALID", *localid) : info.rank;
  const int node = nodeid ? parse_int("SLURM_NODEID", *nodeid) : 0;
  auto nodelist = first_set(lookup, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  std::vector<std::string> hosts;
  if (nodelist) hosts = expand_slurm_nodelist(nodelist->second, nodelist->first);

  if (auto per_node = first_set(lookup, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    const std::vector<int> tasks = expand_slurm_tasks_per_node(per_node->second, per_node->first);
    EMBER_CHECK(node >= 0 && node < static_cast<int>(tasks.size()), "rendezvous: SLURM_NODEID=", node,
                " but ", per_node->first, "='", per_node->second, "' describes ", tasks.size(), " node(s)");
    long long total = 0;
    for (int t : tasks) total += t;
    EMBER_CHECK(total == info.world_size, "rendezvous: ", per_node->first, "='", per_node->second, "' adds up to ",
                total, " tasks but ", ntasks->first, "=", info.world_size);
    info.local_world_size = tasks[node];
    info.launcher_num_nodes = static_cast<int>(tasks.size());
  } else if (auto uniform = lookup("SLURM_NTASKS_PER_NODE")) {
    info.local_world_size = parse_int("SLURM_NTASKS_PER_NODE", *uniform);
    info.launcher_num_nodes = (info.world_size + info.local_world_size - 1) / std::max(1, info.local_world_size);
  } else {
    EMBER_CHECK(hosts.size() <= 1, "rendezvous: started by Slurm on ", hosts.size(),
                " nodes but SLURM_TASKS_PER_NODE is not set, so this node's task count is unknown");
    info.local_world_size = info.world_size;
    info.launcher_num_nodes = 1;
  }
  info.launcher_node_rank = node;
  check_local(info, "SLURM_LOCALID", "the tasks on this node", ntasks->first);
  EMBER_CHECK(node < info.launcher_num_nodes, "rendezvous: SLURM_NODEID=", node, " is out of range for ",
              info.launcher_num_nodes, " node(s)");

  if (auto addr = lookup("MASTER_ADDR")) {
    read_master_addr(info, *addr);
  } else if (!hosts.empty()) {
    info.master_addr = hosts.front();
  } else {
    EMBER_CHECK(info.launcher_num_nodes == 1, "rendezvous: started by Slurm on ", info.launcher_num_nodes,
                " nodes but neither MASTER_ADDR nor SLURM_JOB_NODELIST is set");
    info.master_addr = "127.0.0.1";
  }
  if (auto port = lookup("MASTER_PORT")) {
    read_master_port(info, *port);
  } else if (info.world_size > 1) {
    auto job = first_set(lookup, {"SLURM_JOB_ID", "SLURM_JOBID"});
    EMBER_CHECK(job, "rendezvous: started by Slurm but neither MASTER_PORT nor SLURM_JOB_ID is set");
    const long long id = parse_integer(job->first, job->second);
    EMBER_CHECK(id >= 0, "rendezvous: ", job->first, "='", job->second, "' is not a job id");
    info.master_port = slurm_port_for_job(id);
  }
  return info;
}

// Variables that `ember launch` or torchrun set say where they came from; others may have
// leaked in from a shell.
bool set_by_a_launcher(const Lookup& lookup) {
  return lookup("EMBER_LAUNCHED_BY").has_value() || lookup("TORCHELASTIC_RUN_ID").has_value();
}

}  // namespace

int slurm_port_for_job(long long job_id) { return 20000 + static_cast<int>(job_id % 10000); }

RendezvousInfo rendezvous_info_from(const Lookup& lookup) {
  const bool rank_variables = lookup("RANK") || lookup("WORLD_SIZE") || lookup("LOCAL_RANK");
  if (rank_variables && set_by_a_launcher(lookup)) return from_rank_variables(lookup);
  const std::optional<RendezvousInfo> mpi = from_mpi(lookup);
  const std::optional<RendezvousInfo> slurm = mpi ? std::nullopt : from_slurm(lookup);
  const std::optional<RendezvousInfo>& outer = mpi ? mpi : slurm;
  if (rank_variables) {
    RendezvousInfo info = from_rank_variables(lookup);
    if (outer && (outer->rank != info.rank || outer->world_size != info.world_size))
      EMBER_FAIL("rendezvous: RANK=", info.rank, " and WORLD_SIZE=", info.world_size, " disagree with ",
                 outer->started_by, ", which started this process as rank ", outer->rank, " of ", outer->world_size,
                 " (", mpi ? "OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/SIZE" : "SLURM_PROCID/SLURM_NTASKS",
                 "); unset RANK and WORLD_SIZE, or start the ranks with `ember launch`");
    return info;
  }
  if (outer) return *outer;
  return from_rank_variables(lookup);
}

std::optional<std::string> environment_variable(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

RendezvousInfo rendezvous_info_from_env() { return rendezvous_info_from(environment_variable); }

}  // namespace ember::distributed
