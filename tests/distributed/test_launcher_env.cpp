// Who a process is when srun or mpirun started it, and when their variables meet the ones
// `ember launch` or a user set: the innermost launcher wins, a contradiction is an error.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "distributed/rendezvous.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

using Env = std::map<std::string, std::string>;

RendezvousInfo parse(const Env& env) {
  return rendezvous_info_from([&](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// Task `procid` of an srun step of 5 tasks on node[01-02]: 3 on the first node, 2 on the second.
Env srun_env(int procid) {
  const int node = procid < 3 ? 0 : 1;
  return {{"SLURM_JOB_ID", "123456"},        {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", std::to_string(procid)}, {"SLURM_NTASKS", "5"},
          {"SLURM_LOCALID", std::to_string(node == 0 ? procid : procid - 3)},
          {"SLURM_NODEID", std::to_string(node)},   {"SLURM_STEP_TASKS_PER_NODE", "3,2"},
          {"SLURM_JOB_NODELIST", "node[01-02]"},    {"SLURM_CPUS_PER_TASK", "2"}};
}

TEST(SlurmEnv, EveryTaskOfAStepKnowsItsPlace) {
  for (int procid = 0; procid < 5; ++procid) {
    const RendezvousInfo info = parse(srun_env(procid));
    EXPECT_EQ(info.started_by, "Slurm");
    EXPECT_EQ(info.rank, procid);
    EXPECT_EQ(info.world_size, 5);
    EXPECT_EQ(info.local_rank, procid < 3 ? procid : procid - 3);
    EXPECT_EQ(info.local_world_size, procid < 3 ? 3 : 2);
    // Uneven tasks per node: the node index is Slurm's, not rank / local_world_size.
    EXPECT_EQ(info.node_rank(), procid < 3 ? 0 : 1);
    EXPECT_EQ(info.num_nodes(), 2);
    EXPECT_EQ(info.master_addr, "node01");
    EXPECT_EQ(info.master_port, slurm_port_for_job(123456));
  }
  EXPECT_EQ(slurm_port_for_job(123456), 23456);
  EXPECT_EQ(slurm_port_for_job(7), 20007);
}

TEST(SlurmEnv, MasterVariablesAndOlderNamesAreHonoured) {
  Env env = srun_env(4);
  env["MASTER_ADDR"] = "10.0.0.1";
  env["MASTER_PORT"] = "29600";
  RendezvousInfo info = parse(env);
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 29600);

  // Older Slurm: SLURM_STEPID, SLURM_NPROCS, SLURM_NODELIST, SLURM_TASKS_PER_NODE, SLURM_JOBID.
  Env old = {{"SLURM_STEPID", "3"},        {"SLURM_PROCID", "1"},       {"SLURM_NPROCS", "4"},
             {"SLURM_LOCALID", "1"},       {"SLURM_NODEID", "0"},       {"SLURM_TASKS_PER_NODE", "2(x2)"},
             {"SLURM_NODELIST", "a,b"},    {"SLURM_JOBID", "99"}};
  info = parse(old);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.num_nodes(), 2);
  EXPECT_EQ(info.master_addr, "a");
  EXPECT_EQ(info.master_port, 20099);
}

TEST(SlurmEnv, UniformTasksPerNodeAndOneNodeSteps) {
  Env env = {{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "3"},           {"SLURM_NTASKS", "4"},
             {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},           {"SLURM_NTASKS_PER_NODE", "2"},
             {"SLURM_JOB_ID", "5"},  {"SLURM_JOB_NODELIST", "c[1-2]"}};
  RendezvousInfo info = parse(env);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.node_rank(), 1);
  EXPECT_EQ(info.num_nodes(), 2);

  // Just the essentials on one node.
  info = parse({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "8"}});
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.master_port, 20008);
}

TEST(SlurmEnv, TheBatchScriptItselfIsOneProcess) {
  // sbatch sets SLURM_PROCID and SLURM_NTASKS for the script, which is no task of a step.
  Env env = srun_env(0);
  env.erase("SLURM_STEP_ID");
  const RendezvousInfo info = parse(env);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.started_by, "single process");
}

TEST(SlurmEnv, InconsistentStepsAreErrorsNamingTheVariable) {
  // One variable of a consistent step changed (an empty value: removed), and what the error names.
  const std::vector<std::tuple<std::string, std::string, std::vector<std::string>>> cases = {
      {"SLURM_STEP_TASKS_PER_NODE", "3(x2)", {"SLURM_STEP_TASKS_PER_NODE='3(x2)' adds up to 6 tasks but SLURM_NTASKS=5"}},
      {"SLURM_NODEID", "2", {"SLURM_NODEID=2", "describes 2 node(s)"}},
      {"SLURM_PROCID", "5", {"SLURM_PROCID='5' is out of range for SLURM_NTASKS=5"}},
      {"SLURM_LOCALID", "2", {"SLURM_LOCALID='2' is out of range"}},
      {"SLURM_JOB_NODELIST", "node[02-01]", {"SLURM_JOB_NODELIST='node[02-01]'", "runs backwards"}},
      {"SLURM_JOB_ID", "", {"neither MASTER_PORT nor SLURM_JOB_ID"}},
      {"SLURM_JOB_ID", "x1", {"SLURM_JOB_ID='x1' is not an integer"}},
  };
  for (const auto& [name, value, fragments] : cases) {
    SCOPED_TRACE(name + "=" + value);
    Env env = srun_env(4);
    if (value.empty()) env.erase(name);
    else env[name] = value;
    try {
      parse(env);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  }
}

TEST(MpiEnv, OpenMpiAndMpichVariables) {
  RendezvousInfo info = parse({{"OMPI_COMM_WORLD_RANK", "2"},
                               {"OMPI_COMM_WORLD_SIZE", "4"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                               {"OMPI_MCA_ess_base_jobid", "3141"}});
  EXPECT_EQ(info.started_by, "MPI");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_GE(info.master_port, 20000);
  EXPECT_LT(info.master_port, 30000);
  // Every rank derives the same port from the same job; another job gets another.
  const int port = info.master_port;
  EXPECT_EQ(parse({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_MCA_ess_base_jobid", "3141"}})
                .master_port,
            port);
  EXPECT_NE(parse({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_MCA_ess_base_jobid", "3142"}})
                .master_port,
            port);

  info = parse({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"},
                {"MASTER_PORT", "29700"}});
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.master_port, 29700);
}

TEST(MpiEnv, SeveralMachinesNeedMasterAddr) {
  const Env env = {{"OMPI_COMM_WORLD_RANK", "3"},       {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"OMPI_MCA_ess_base_jobid", "1"}};
  EXPECT_EMBER_ERROR(parse(env), "Open MPI's mpirun", "MASTER_ADDR is not set", "mpirun -x MASTER_ADDR");
  Env with = env;
  with["MASTER_ADDR"] = "head";
  EXPECT_EQ(parse(with).master_addr, "head");
  EXPECT_EMBER_ERROR(parse({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}), "neither MASTER_PORT nor the MPI job's id");
  EXPECT_EMBER_ERROR(parse({{"OMPI_COMM_WORLD_RANK", "0"}}), "OMPI_COMM_WORLD_RANK='0' is set but OMPI_COMM_WORLD_SIZE");
}

TEST(MpiEnv, MpirunInsideASlurmJobIsMpi) {
  // mpirun's daemons are Slurm tasks, one per node: their SLURM_PROCID is no rank.
  Env env = srun_env(1);
  env.insert({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
              {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"MASTER_ADDR", "node01"}, {"MASTER_PORT", "29800"}});
  const RendezvousInfo info = parse(env);
  EXPECT_EQ(info.started_by, "MPI");
  EXPECT_EQ(info.rank, 4);
  EXPECT_EQ(info.world_size, 8);
}

TEST(LauncherPrecedence, EmberLaunchUnderSrunIsBelieved) {
  Env env = srun_env(0);
  env.insert({{"RANK", "2"}, {"WORLD_SIZE", "10"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "5"},
              {"MASTER_ADDR", "node01"}, {"MASTER_PORT", "29500"}, {"EMBER_LAUNCHED_BY", "ember launch"}});
  const RendezvousInfo info = parse(env);
  EXPECT_EQ(info.started_by, "RANK/WORLD_SIZE");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 10);
  EXPECT_EQ(info.local_world_size, 5);
  // torchrun marks its variables too.
  env.erase("EMBER_LAUNCHED_BY");
  env["TORCHELASTIC_RUN_ID"] = "job";
  EXPECT_EQ(parse(env).rank, 2);
}

TEST(LauncherPrecedence, AgreeingHandSetVariablesAreFine) {
  Env env = srun_env(3);
  env.insert({{"RANK", "3"}, {"WORLD_SIZE", "5"}, {"MASTER_ADDR", "node01"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(parse(env).rank, 3);
}

TEST(LauncherPrecedence, ContradictingVariablesNameBothSides) {
  Env env = srun_env(3);
  env.insert({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "29500"}});
  EXPECT_EMBER_ERROR(parse(env), "RANK=0 and WORLD_SIZE=2 disagree with Slurm", "rank 3 of 5",
                     "SLURM_PROCID/SLURM_NTASKS", "`ember launch`");
  // (Open MPI's mpirun always sets its job id, which the port derives from.)
  Env mpi = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_MCA_ess_base_jobid", "1919156225"},
             {"RANK", "0"}, {"WORLD_SIZE", "1"}};
  EXPECT_EMBER_ERROR(parse(mpi), "RANK=0 and WORLD_SIZE=1 disagree with MPI", "rank 1 of 2");
}

}  // namespace
}  // namespace ember::distributed
