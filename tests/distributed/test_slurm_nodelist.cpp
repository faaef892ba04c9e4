// Slurm's compressed host and task lists, in every form srun and sbatch write, and the
// mistakes a hand-written list can hold.
#include "distributed/slurm_nodelist.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace ember::distributed {
namespace {

using Hosts = std::vector<std::string>;

TEST(SlurmNodelist, PlainNamesAndSingleHosts) {
  EXPECT_EQ(expand_slurm_nodelist("node1"), Hosts({"node1"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b.cluster,c_d-e"), Hosts({"a", "b.cluster", "c_d-e"}));
}

TEST(SlurmNodelist, RangesKeepTheirWidthAndOrder) {
  EXPECT_EQ(expand_slurm_nodelist("node[01-04,07]"), Hosts({"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand_slurm_nodelist("n[08-10]"), Hosts({"n08", "n09", "n10"}));
  EXPECT_EQ(expand_slurm_nodelist("n[9-11]"), Hosts({"n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu[3]"), Hosts({"gpu3"}));
}

TEST(SlurmNodelist, SeveralItemsAndSeveralGroupsInOneName) {
  EXPECT_EQ(expand_slurm_nodelist("a,b[1-2],login-1"), Hosts({"a", "b1", "b2", "login-1"}));
  EXPECT_EQ(expand_slurm_nodelist("rack[1-2]n[3-4]"), Hosts({"rack1n3", "rack1n4", "rack2n3", "rack2n4"}));
  EXPECT_EQ(expand_slurm_nodelist("x[1-2]-ib"), Hosts({"x1-ib", "x2-ib"}));
}

TEST(SlurmNodelist, MalformedListsNameTheVariableAndTheValue) {
  EXPECT_EMBER_ERROR(expand_slurm_nodelist(""), "SLURM_JOB_NODELIST=''", "empty");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("node[1-3", "SLURM_STEP_NODELIST"), "SLURM_STEP_NODELIST='node[1-3'",
                     "never closed");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("node1-3]"), "has no '['");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("node[5-3]"), "'5-3'", "runs backwards");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("node[a-b]"), "not a number or a range");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("node[]"), "holds no numbers");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("a,,b"), "empty entry");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("a b"), "' ' cannot be part of a host name");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("n[[1-2]]"), "nested");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("n[0-999999999]"), "more than 1000000 hosts");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("n[0-999]m[0-9999]"), "more than 1000000 hosts");
  EXPECT_EMBER_ERROR(expand_slurm_nodelist("n[1-99999999999999999999999]"), "too large");
}

TEST(SlurmTasksPerNode, CountsAndRepeats) {
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), std::vector<int>({4}));
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), std::vector<int>({2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("1,3(x2)"), std::vector<int>({1, 3, 3}));
}

TEST(SlurmTasksPerNode, MalformedListsAreErrors) {
  EXPECT_EMBER_ERROR(expand_slurm_tasks_per_node(""), "SLURM_TASKS_PER_NODE=''", "empty");
  EXPECT_EMBER_ERROR(expand_slurm_tasks_per_node("0"), "'0' is not a positive task count");
  EXPECT_EMBER_ERROR(expand_slurm_tasks_per_node("2(3)"), "'2(3)' is not N or N(xM)");
  EXPECT_EMBER_ERROR(expand_slurm_tasks_per_node("2(x0)"), "not a positive repeat count");
  EXPECT_EMBER_ERROR(expand_slurm_tasks_per_node("2,,1", "SLURM_STEP_TASKS_PER_NODE"),
                     "SLURM_STEP_TASKS_PER_NODE='2,,1'", "empty entry");
  EXPECT_EMBER_ERROR(expand_slurm_tasks_per_node("1(x2000000)"), "more than 1000000 nodes");
  EXPECT_EMBER_ERROR(expand_slurm_tasks_per_node("-1"), "not a positive task count");
}

}  // namespace
}  // namespace ember::distributed
