// env:// rendezvous, as torchrun and `ember launch` set it up: every rank reads who it is from
// the environment, rank 0 serves a TcpStore at MASTER_ADDR:MASTER_PORT, the others connect to
// it, and a store barrier makes sure the whole job showed up before training starts.
//
//   RendezvousInfo info = rendezvous_info_from_env();
//   std::shared_ptr<Store> store = rendezvous(info, std::chrono::seconds(30));
//
// With none of the variables set, the program is a single process (rank 0 of 1).
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "distributed/store.h"

namespace ember::distributed {

struct RendezvousInfo {
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 only for a single process: any free port
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // index of this process on its machine
  int local_world_size = 1;  // processes on this machine
  // Who said so: "single process", "RANK/WORLD_SIZE", "Slurm" or "MPI".
  std::string started_by = "single process";
  // The machine's index and count when the launcher states them (Slurm's SLURM_NODEID and
  // node count, which allow a different number of tasks per node); -1 otherwise.
  int launcher_node_rank = -1;
  int launcher_num_nodes = -1;

  // The machine's index; without the launcher's word, every machine is assumed to run
  // local_world_size processes.
  int node_rank() const { return launcher_node_rank >= 0 ? launcher_node_rank : rank / local_world_size; }
  int num_nodes() const {
    return launcher_num_nodes >= 0 ? launcher_num_nodes : (world_size + local_world_size - 1) / local_world_size;
  }
};

// Who this process is, from the variables of whichever launcher started it; the innermost
// launcher wins, since an outer one describes its launchers, not the ranks:
//  1. RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (`ember launch`,
//     torchrun, or set by hand). RANK and WORLD_SIZE come together (as do LOCAL_RANK and
//     LOCAL_WORLD_SIZE, which default to a single machine); MASTER_ADDR and MASTER_PORT are
//     required once WORLD_SIZE > 1.
//  2. MPI (mpirun, possibly itself inside a Slurm job): OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/
//     LOCAL_SIZE (Open MPI) or PMI_RANK/PMI_SIZE with MPI_LOCALRANKID/MPI_LOCALNRANKS (MPICH).
//     The master is MASTER_ADDR, or this machine when every rank runs on it; the port is
//     MASTER_PORT or derived from the MPI job's id.
//  3. Slurm (inside an srun step, SLURM_STEP_ID set): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//     SLURM_NODEID, the tasks per node from SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE
//     (or SLURM_NTASKS_PER_NODE), and the first host of SLURM_STEP_NODELIST /
//     SLURM_JOB_NODELIST as the master unless MASTER_ADDR is set; the port is MASTER_PORT or
//     slurm_port_for_job(SLURM_JOB_ID).
// Variables set by `ember launch` carry EMBER_LAUNCHED_BY (torchrun's carry
// TORCHELASTIC_RUN_ID), so a launcher running inside srun or mpirun is believed. RANK or
// WORLD_SIZE set otherwise (by hand, or leaked from a shell) that contradict Slurm's or MPI's
// are an ember::Error naming both. A malformed, inconsistent or half-set value is an
// ember::Error naming the variable and its value.
RendezvousInfo rendezvous_info_from_env();
// The same, reading variables through `lookup` (nullopt = unset) instead of the environment.
RendezvousInfo rendezvous_info_from(const std::function<std::optional<std::string>(const std::string&)>& lookup);

// One environment variable; nullopt when unset (the lookup rendezvous_info_from_env uses).
std::optional<std::string> environment_variable(const std::string& name);

// The store's port for a Slurm job without MASTER_PORT: 20000 + job_id % 10000, below Linux's
// ephemeral range (32768 and up) so that no outgoing connection holds it, and the same on
// every node of the job.
int slurm_port_for_job(long long job_id);

// The address rank 0's store listens on (on every address it resolves to):
// EMBER_STORE_BIND_ADDR when set; MASTER_ADDR itself when that is loopback (127.0.1.1,
// "localhost", ::1, or a host name that resolves to loopback only, the latter on one machine),
// so the store answers exactly where the other ranks dial; otherwise every interface
// ("0.0.0.0", or "::" for an IPv6 MASTER_ADDR).
std::string store_bind_address(const RendezvousInfo& info);

// Rank 0 starts the store server, the other ranks connect to it (retrying until `timeout`,
// saying on stderr after a few seconds what they dial and why they still wait).
std::shared_ptr<Store> connect_store(const RendezvousInfo& info, std::chrono::milliseconds timeout);

// Returns once all world_size ranks have called it with the same `name`, or throws
// "rendezvous: only 1 of 2 ranks arrived within 30s (missing ranks: 1)". Each rank records its
// arrival under "<name>/rank_<r>" and bumps the counter "<name>". A name is good for one barrier
// per store. While ranks are missing, rank 0 says on stderr which ones (after 5 s, then every
// 30 s).
void rendezvous_barrier(Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
                        const std::string& name = "ember/rendezvous");

// connect_store followed by rendezvous_barrier.
std::shared_ptr<Store> rendezvous(const RendezvousInfo& info, std::chrono::milliseconds timeout);

}  // namespace ember::distributed
