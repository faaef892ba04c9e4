#include "command_line.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

#include "accelerate/fsdp_settings.h"
#include "core/error.h"

namespace ember::cli {

namespace {

using distributed::LaunchConfig;

int positive(const std::string& value, const char* flag) {
  const int n = parse_int(value, std::string("--") + flag);
  if (n < 1) throw UsageError(std::string("--") + flag + ": expected a positive integer, got " + value);
  return n;
}

int non_negative(const std::string& value, const char* flag) {
  const int n = parse_int(value, std::string("--") + flag);
  if (n < 0) throw UsageError(std::string("--") + flag + ": expected a non-negative integer, got " + value);
  return n;
}

// A number of seconds: positive, or also zero when `zero_allowed`.
double seconds_value(const std::string& value, const char* flag, bool zero_allowed) {
  double seconds = 0;
  const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  const bool in_range = std::isfinite(seconds) && (zero_allowed ? seconds >= 0 : seconds > 0);
  if (value.empty() || ec != std::errc() || ptr != value.data() + value.size() || !in_range)
    throw UsageError(std::string("--") + flag + ": expected a " + (zero_allowed ? "non-negative" : "positive") +
                     " number of seconds, got '" + value + "'");
  return seconds;
}

// --fsdp_NAME VALUE: one field of the sharding options, which it turns on when they are off.
ConfigFlag fsdp_flag(const distributed::FSDPSetting& setting) {
  return {setting.key, setting.accepted, setting.help, [&setting](LaunchConfig& c, const std::string& v) {
            distributed::FSDPOptions options = c.fsdp.value_or(distributed::FSDPOptions{});
            try {
              setting.parse(options, v);
            } catch (const Error& e) {
              throw UsageError(std::string("--") + setting.key + ": " + e.what());
            }
            c.fsdp = options;
          }};
}

std::vector<ConfigFlag> make_config_flags() {
  std::vector<ConfigFlag> flags = {
      {"num_processes", "N", "processes in total, over all machines (default 1)",
       [](LaunchConfig& c, const std::string& v) { c.num_processes = positive(v, "num_processes"); }},
      {"num_machines", "M", "machines taking part (default 1)",
       [](LaunchConfig& c, const std::string& v) { c.num_machines = positive(v, "num_machines"); }},
      {"machine_rank", "R", "rank of this machine, 0 .. M-1 (default 0)",
       [](LaunchConfig& c, const std::string& v) { c.machine_rank = non_negative(v, "machine_rank"); }},
      {"main_process_ip", "IP", "address of machine 0 (default 127.0.0.1)",
       [](LaunchConfig& c, const std::string& v) { c.main_process_ip = v; }},
      {"main_process_port", "P", "port on machine 0 the ranks meet at (default 29500)",
       [](LaunchConfig& c, const std::string& v) {
         const int port = parse_int(v, "--main_process_port");
         if (port < 1 || port > 65535)
           throw UsageError("--main_process_port: expected a port in 1..65535, got " + v);
         c.main_process_port = port;
       }},
      {"mixed_precision", "no|fp16|bf16", "mixed precision mode (default no)",
       [](LaunchConfig& c, const std::string& v) {
         if (v != "no" && v != "fp16" && v != "bf16")
           throw UsageError("--mixed_precision: unknown value '" + v + "' (expected one of: no, fp16, bf16)");
         c.mixed_precision = v;
       }},
      {"gradient_accumulation_steps", "K", "micro-batches per optimizer step (default 1)",
       [](LaunchConfig& c, const std::string& v) {
         c.gradient_accumulation_steps = positive(v, "gradient_accumulation_steps");
       }},
      {"num_cpu_threads_per_process", "T", "threads per rank (default: cores / local ranks)",
       [](LaunchConfig& c, const std::string& v) {
         c.num_cpu_threads_per_process = non_negative(v, "num_cpu_threads_per_process");
       }},
      {"cpu", nullptr, "run on the CPU even when GPUs are present",
       [](LaunchConfig& c, const std::string&) { c.use_cpu = true; }},
      {"use_cpu", "yes|no", "the same as --cpu, spelled out",
       [](LaunchConfig& c, const std::string& v) { c.use_cpu = parse_bool(v, "--use_cpu"); }},
      {"max_restarts", "N", "restart every rank up to N times after one fails (default 0)",
       [](LaunchConfig& c, const std::string& v) { c.max_restarts = non_negative(v, "max_restarts"); }},
      {"monitor_interval", "S", "seconds between progress checks of the ranks (default 5)",
       [](LaunchConfig& c, const std::string& v) { c.monitor_interval = seconds_value(v, "monitor_interval", false); }},
      {"heartbeat_timeout", "S", "seconds without progress that fail a rank (default 0: never)",
       [](LaunchConfig& c, const std::string& v) { c.heartbeat_timeout = seconds_value(v, "heartbeat_timeout", true); }},
      {"rdzv_timeout", "S", "seconds machines' launchers wait for each other at restarts (default 300)",
       [](LaunchConfig& c, const std::string& v) { c.rdzv_timeout = seconds_value(v, "rdzv_timeout", false); }},
      {"use_fsdp", nullptr, "shard the model across ranks (FSDP); any --fsdp_* flag implies it",
       [](LaunchConfig& c, const std::string& v) {
         if (v.empty() || parse_bool(v, "--use_fsdp")) {
           if (!c.fsdp) c.fsdp = distributed::FSDPOptions{};
         } else {
           c.fsdp.reset();
         }
       }},
  };
  for (const distributed::FSDPSetting& setting : distributed::fsdp_settings()) flags.push_back(fsdp_flag(setting));
  return flags;
}

}  // namespace

const std::vector<ConfigFlag>& config_flags() {
  static const std::vector<ConfigFlag> flags = make_config_flags();
  return flags;
}

const ConfigFlag* find_config_flag(std::string_view name) {
  for (const ConfigFlag& flag : config_flags())
    if (name == flag.name) return &flag;
  return nullptr;
}

std::string describe_config_flags() {
  std::ostringstream out;
  for (const ConfigFlag& flag : config_flags()) {
    std::string left = std::string("--") + flag.name;
    if (flag.value_name) left += std::string(" ") + flag.value_name;
    // A long flag gets its help on the next line, in the same column.
    const std::string gap = left.size() < 42 ? std::string(42 - left.size(), ' ') : "\n" + std::string(44, ' ');
    out << "  " << left << gap << flag.help << "\n";
  }
  return out.str();
}

bool split_flag(std::string_view arg, std::string& name, std::string& value, bool& has_value) {
  if (arg.size() < 3 || arg.substr(0, 2) != "--") return false;
  arg.remove_prefix(2);
  const size_t eq = arg.find('=');
  has_value = eq != std::string_view::npos;
  name = std::string(arg.substr(0, eq));
  std::replace(name.begin(), name.end(), '-', '_');
  value = has_value ? std::string(arg.substr(eq + 1)) : std::string();
  return true;
}

int parse_int(const std::string& text, const std::string& what) {
  int value = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (!text.empty() && ec == std::errc::result_out_of_range && ptr == end)
    throw UsageError(what + ": " + text + " is out of range (" + std::to_string(std::numeric_limits<int>::min()) +
                     " .. " + std::to_string(std::numeric_limits<int>::max()) + ")");
  if (text.empty() || ec != std::errc() || ptr != end)
    throw UsageError(what + ": expected an integer, got '" + text + "'");
  return value;
}

bool parse_bool(const std::string& text, const std::string& what) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (lower == "yes" || lower == "y" || lower == "true" || lower == "1") return true;
  if (lower == "no" || lower == "n" || lower == "false" || lower == "0") return false;
  throw UsageError(what + ": expected yes or no, got '" + text + "'");
}

}  // namespace ember::cli
