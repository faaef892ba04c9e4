// LaunchConfig: how a job is started (processes, machines, rendezvous address, precision), as
// written by `ember config`, read by `ember launch`, and readable by a program started without
// the launcher. Stored as YAML with the key names of Accelerate's default_config.yaml:
//
//   compute_environment: LOCAL_MACHINE
//   distributed_type: MULTI_CPU        # NO | MULTI_CPU | MULTI_GPU, derived (see below)
//   num_processes: 4                   # total over all machines
//   num_machines: 1
//   machine_rank: 0
//   main_process_ip: 10.0.0.1          # written only when set
//   main_process_port: 29500
//   mixed_precision: 'no'              # no | fp16 | bf16
//   gradient_accumulation_steps: 1
//   num_cpu_threads_per_process: 0     # 0: cores / local processes
//   use_cpu: true
//   max_restarts: 0                    # restarts of every rank after a failure (elastic)
//   monitor_interval: 5                # seconds between the launcher's progress checks
//   heartbeat_timeout: 0               # seconds without progress that fail a rank (0: never)
//   rdzv_timeout: 300                  # seconds launchers wait for each other at restarts
//   fsdp_config:                       # sharded data parallel; written only when on
//     fsdp_sharding_strategy: FULL_SHARD
//     fsdp_transformer_layer_cls_to_wrap: BertLayer
//
// fsdp_config takes Accelerate's keys (accelerate/fsdp_settings.h lists them); an unknown one
// is an error listing the known ones, and strategies are names, never Accelerate's numbers. An
// empty fsdp_config (Accelerate writes `fsdp_config: {}` for every job) leaves sharding off.
//
// Accelerate keeps gradient_accumulation_steps inside its DeepSpeed plugin section; Ember has no
// plugins, so it is a top-level key here (like the --gradient_accumulation_steps launch flag).
//
// distributed_type is derived from the other keys: FSDP when sharding is on, else NO for one
// process in total, otherwise MULTI_CPU when use_cpu is set and MULTI_GPU when not. A file may
// state it; it must then agree: NO with more than one process, or MULTI_GPU with use_cpu: true,
// is an error, and MULTI_CPU turns use_cpu on (that is what it means). FSDP needs an
// fsdp_config mapping (empty: the FSDPOptions defaults), and the other types a missing or empty
// one.
//
// Every problem is an ember::Error naming the file, the key and the bad value.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/fsdp_options.h"

namespace ember::distributed {

enum class DistributedType { NO, MULTI_CPU, MULTI_GPU, FSDP };
const char* distributed_type_name(DistributedType type);

struct LaunchConfig {
  int num_processes = 1;  // over all machines
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip;  // empty: 127.0.0.1
  int main_process_port = 29500;
  std::string mixed_precision = "no";  // no | fp16 | bf16
  int gradient_accumulation_steps = 1;
  int num_cpu_threads_per_process = 0;  // 0: cores / local processes, at least 1
  bool use_cpu = false;
  // Times `ember launch` restarts every rank after one fails (torchrun's --max_restarts); the
  // program resumes from its latest checkpoint (Accelerator::load_state()).
  int max_restarts = 0;
  // Seconds between the launcher's looks at the ranks' progress: a rank that made none for
  // that long is named on stderr (torchrun's --monitor_interval).
  double monitor_interval = 5;
  // Seconds a rank may go without progress (after its first backward pass) before the launcher
  // treats it as failed: stops every rank and, with max_restarts, restarts them (a hung or
  // stopped rank). 0: never; such a rank is only named.
  double heartbeat_timeout = 0;
  // With max_restarts on several machines: seconds a machine's launcher waits for the others
  // when the job starts and after each attempt; a machine that does not come back within it
  // ends the job (torchrun's rendezvous join timeout).
  double rdzv_timeout = 300;
  // Sharded data parallel for every rank (`--use_fsdp`, the fsdp_config mapping); unset: DDP.
  std::optional<FSDPOptions> fsdp;

  DistributedType distributed_type() const;
  // Ranks started on this machine: num_processes / num_machines.
  int local_processes() const;
  // The address ranks meet at: main_process_ip, or 127.0.0.1 when unset.
  std::string master_address() const;

  // Throws ember::Error when a value is out of range or the values disagree; `source` (a file
  // name, or "command line") starts the message.
  void validate(const std::string& source) const;

  // Reads and validates a YAML file. Unknown keys are errors that list the known ones; so is a
  // key written twice in one mapping (at any depth), naming both lines.
  static LaunchConfig load_yaml(const std::string& path);
  // Writes the YAML atomically (temporary file in the same directory, then rename), creating
  // the directory when needed.
  void save_yaml(const std::string& path) const;
  std::string to_yaml() const;
};

// The keys a config file may hold, in the order save_yaml writes them.
const std::vector<std::string>& launch_config_keys();

// Where the default config lives: $EMBER_CONFIG_FILE, else
// $XDG_CONFIG_HOME/ember/default_config.yaml, else ~/.config/ember/default_config.yaml.
std::string default_config_path();
// The default config file's content when it exists, nullopt when it does not.
std::optional<LaunchConfig> load_default_config();

// CPUs this process may run on (its affinity mask), at least 1.
int available_cpus();
// Threads per rank: num_cpu_threads_per_process when set, else available_cpus() / local ranks,
// at least 1.
int threads_per_process(const LaunchConfig& config);

// The environment `ember launch` gives local rank `local_rank` of this machine:
// MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the
// machine rank), EMBER_MIXED_PRECISION, EMBER_GRADIENT_ACCUMULATION_STEPS, EMBER_USE_CPU ("1"
// when the user asked for the CPU, else "0": a rank without a GPU still runs on the CPU),
// EMBER_NUM_THREADS, OMP_NUM_THREADS, and EMBER_USE_FSDP ("false", or "true" followed by the
// EMBER_FSDP_* variables of fsdp_env(), accelerate/fsdp_env.h).
std::vector<std::pair<std::string, std::string>> rank_environment(const LaunchConfig& config, int local_rank);

}  // namespace ember::distributed
