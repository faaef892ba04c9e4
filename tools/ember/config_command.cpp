// `ember config`: asks for each setting (a default in brackets, Enter keeps it), or takes the
// answers as flags, then writes the YAML config that `ember launch` reads.
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "accelerate/fsdp_settings.h"
#include "accelerate/launch_config.h"
#include "command_line.h"
#include "core/device_api.h"
#include "core/error.h"
#include "subcommands.h"

namespace ember::cli {

namespace {

using distributed::LaunchConfig;

struct Question {
  const char* flag;  // the config flag that takes the answer
  const char* text;
  bool (*applies)(const LaunchConfig&);
  std::string (*current)(const LaunchConfig&);
  // Checks against answers given earlier; returns a complaint, or "" when fine.
  std::string (*check)(const LaunchConfig&);
};

bool always(const LaunchConfig&) { return true; }
bool several_machines(const LaunchConfig& c) { return c.num_machines > 1; }
std::string fine(const LaunchConfig&) { return ""; }
// A number of seconds as a user types it: 2.5, 300.
std::string shortest(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}
bool several_processes(const LaunchConfig& c) { return c.num_processes > 1; }
bool sharded(const LaunchConfig& c) { return c.fsdp.has_value(); }
bool wraps_by_type(const LaunchConfig& c) {
  return c.fsdp && c.fsdp->auto_wrap_policy == distributed::AutoWrapPolicy::TRANSFORMER_BASED_WRAP;
}
bool wraps_by_size(const LaunchConfig& c) {
  return c.fsdp && c.fsdp->auto_wrap_policy == distributed::AutoWrapPolicy::SIZE_BASED_WRAP;
}
// A sharding field as its flag takes it ("" for an empty class list).
std::string fsdp_field(const LaunchConfig& c, const char* key) {
  return distributed::find_fsdp_setting(key)->format(c.fsdp.value_or(distributed::FSDPOptions{})).value_or("");
}

const std::vector<Question>& questions() {
  static const std::vector<Question> list = {
      {"num_machines", "How many machines will take part?", always,
       [](const LaunchConfig& c) { return std::to_string(c.num_machines); }, fine},
      {"machine_rank", "What is the rank of this machine (0 for the main one)?", several_machines,
       [](const LaunchConfig& c) { return std::to_string(c.machine_rank); },
       [](const LaunchConfig& c) {
         return c.machine_rank < c.num_machines
                    ? std::string()
                    : "the rank must be below the number of machines (" + std::to_string(c.num_machines) + ")";
       }},
      {"main_process_ip", "What is the IP address of the main machine (rank 0)?", several_machines,
       [](const LaunchConfig& c) { return c.master_address(); }, fine},
      {"main_process_port", "Which port on the main machine should the ranks meet at?", several_machines,
       [](const LaunchConfig& c) { return std::to_string(c.main_process_port); }, fine},
      {"num_processes", "How many processes in total, over all machines?", always,
       [](const LaunchConfig& c) { return std::to_string(c.num_processes); },
       [](const LaunchConfig& c) {
         return c.num_processes % c.num_machines == 0
                    ? std::string()
                    : "the processes must split evenly over the " + std::to_string(c.num_machines) + " machines";
       }},
      {"use_cpu", "Run on the CPU only, even where GPUs are present? (yes/no)", always,
       [](const LaunchConfig& c) { return std::string(c.use_cpu ? "yes" : "no"); }, fine},
      {"mixed_precision", "Mixed precision: no, fp16 or bf16?", always,
       [](const LaunchConfig& c) { return c.mixed_precision; }, fine},
      {"gradient_accumulation_steps", "How many micro-batches per optimizer step (gradient accumulation)?", always,
       [](const LaunchConfig& c) { return std::to_string(c.gradient_accumulation_steps); }, fine},
      {"num_cpu_threads_per_process", "CPU threads per process (0: cores / processes on this machine)?", always,
       [](const LaunchConfig& c) { return std::to_string(c.num_cpu_threads_per_process); }, fine},
      {"max_restarts", "Restart every process how many times after one fails (0: never)?", always,
       [](const LaunchConfig& c) { return std::to_string(c.max_restarts); }, fine},
      {"rdzv_timeout", "Seconds each machine waits for the others when the job restarts?", several_machines,
       [](const LaunchConfig& c) { return shortest(c.rdzv_timeout); }, fine},
      {"monitor_interval", "Seconds between checks that every process makes progress?", always,
       [](const LaunchConfig& c) { return shortest(c.monitor_interval); }, fine},
      {"use_fsdp", "Shard the model across the processes (FullyShardedDataParallel)? (yes/no)", several_processes,
       [](const LaunchConfig& c) { return std::string(c.fsdp ? "yes" : "no"); }, fine},
      {"fsdp_sharding_strategy", "Sharding strategy: FULL_SHARD, SHARD_GRAD_OP, SHARD_OPTIMIZER or NO_SHARD?",
       sharded, [](const LaunchConfig& c) { return fsdp_field(c, "fsdp_sharding_strategy"); }, fine},
      {"fsdp_auto_wrap_policy", "Auto-wrap policy: TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP?", sharded,
       [](const LaunchConfig& c) { return fsdp_field(c, "fsdp_auto_wrap_policy"); }, fine},
      {"fsdp_transformer_layer_cls_to_wrap", "Module types to wrap, comma-separated (e.g. BertLayer)?",
       wraps_by_type, [](const LaunchConfig& c) { return fsdp_field(c, "fsdp_transformer_layer_cls_to_wrap"); },
       [](const LaunchConfig& c) -> std::string {
         // The wrapper refuses TRANSFORMER_BASED_WRAP without a type (distributed/flat_param.cpp).
         if (!c.fsdp->transformer_layer_cls_to_wrap.empty()) return "";
         return "name at least one module type (the policy wraps nothing else)";
       }},
      {"fsdp_min_num_params", "Parameters per wrapped unit (SIZE_BASED_WRAP)?", wraps_by_size,
       [](const LaunchConfig& c) { return fsdp_field(c, "fsdp_min_num_params"); }, fine},
  };
  return list;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

int visible_gpus() {
  try {
    return cuda_device_count();
  } catch (const Error&) {
    return 0;
  }
}

// Asks until the answer is valid; an empty answer keeps the default.
void ask(const Question& q, LaunchConfig& config) {
  const ConfigFlag* flag = find_config_flag(q.flag);
  for (;;) {
    std::cout << q.text << " [" << q.current(config) << "]: " << std::flush;
    std::string line;
    if (!std::getline(std::cin, line))
      EMBER_FAIL("ember config: input ended before '", q.flag,
                 "' was answered (pass the answers as flags, and --yes to keep the defaults)");
    const std::string answer = trim(line);
    LaunchConfig candidate = config;
    try {
      flag->apply(candidate, answer.empty() ? q.current(config) : answer);
    } catch (const UsageError& e) {
      std::cout << "  " << std::string(e.what()).substr(std::string("--").size()) << "\n";
      continue;
    }
    if (const std::string complaint = q.check(candidate); !complaint.empty()) {
      std::cout << "  " << complaint << "\n";
      continue;
    }
    config = candidate;
    return;
  }
}

}  // namespace

std::string config_usage() {
  return "usage: ember config [--config_file F] [--yes] [answers as flags]\n"
         "\n"
         "Asks how jobs should be launched and writes the answers to the config file that\n"
         "`ember launch` reads. Each question shows its default in brackets; Enter keeps it. A question\n"
         "answered by a flag is not asked; with --yes nothing is asked and the rest keep their defaults\n"
         "(the values of an existing config file, else the built-in ones).\n"
         "\n"
         "options:\n" +
         describe_config_flags() +
         "  --config_file F                           where to write (default: $EMBER_CONFIG_FILE,\n"
         "                                            $XDG_CONFIG_HOME/ember/default_config.yaml or\n"
         "                                            ~/.config/ember/default_config.yaml)\n"
         "  -y, --yes                                 ask nothing\n"
         "  -h, --help                                this text\n";
}

int config_command(const std::vector<std::string>& args) {
  std::optional<std::string> path;
  bool yes = false;
  std::vector<std::pair<const ConfigFlag*, std::string>> answers;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << config_usage();
      return 0;
    }
    if (arg == "-y") {
      yes = true;
      continue;
    }
    std::string name, value;
    bool has_value = false;
    if (!split_flag(arg, name, value, has_value)) throw UsageError("unexpected argument '" + arg + "'");
    if (name == "yes") {
      if (has_value) throw UsageError("option '--yes' takes no value");
      yes = true;
      continue;
    }
    const ConfigFlag* flag = find_config_flag(name);
    if (!flag && name != "config_file") throw UsageError("unknown option '" + arg + "'");
    const bool takes_value = !flag || flag->value_name;
    if (takes_value && !has_value) {
      if (i + 1 >= args.size()) throw UsageError("option '--" + name + "' needs a value");
      value = args[++i];
    } else if (!takes_value && has_value) {
      throw UsageError("option '--" + name + "' takes no value");
    }
    if (flag)
      answers.emplace_back(flag, value);
    else
      path = value;
  }
  const std::string target = path ? *path : distributed::default_config_path();

  LaunchConfig config;
  config.use_cpu = visible_gpus() == 0;
  try {
    std::error_code ec;
    if (std::filesystem::exists(target, ec)) config = LaunchConfig::load_yaml(target);
  } catch (const Error& e) {
    std::cerr << "ember config: ignoring the existing file: " << e.what() << "\n";
  }

  std::set<std::string> answered;
  for (const auto& [flag, value] : answers) {
    flag->apply(config, value);
    answered.insert(flag->name);
    if (std::string(flag->name) == "cpu") answered.insert("use_cpu");
    if (std::string(flag->name).rfind("fsdp_", 0) == 0) answered.insert("use_fsdp");
  }
  if (!yes) {
    for (const Question& q : questions())
      if (!answered.count(q.flag) && q.applies(config)) ask(q, config);
  }
  if (config.num_machines == 1 && !answered.count("machine_rank")) config.machine_rank = 0;
  config.validate("ember config");
  config.save_yaml(target);
  std::cout << "ember config: wrote " << target << "\n";
  return 0;
}

}  // namespace ember::cli
