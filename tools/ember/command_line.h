// Flag parsing shared by the `ember` subcommands: `--name value` and `--name=value`, with
// dashes and underscores in names treated alike (--num-processes == --num_processes).
#pragma once
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "accelerate/launch_config.h"

namespace ember::cli {

// A mistake in how the command was called: reported with the subcommand's usage.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& msg) : std::runtime_error(msg) {}
};

// One flag that sets a LaunchConfig field; `ember launch` and `ember config` take the same set.
struct ConfigFlag {
  const char* name;        // without the leading dashes, underscores as separators
  const char* value_name;  // "N"; nullptr for a flag that takes no value
  const char* help;
  // Throws UsageError for a bad value. A flag without a value gets "" (and `ember config`'s
  // yes/no questions pass their answer to --use_fsdp).
  std::function<void(distributed::LaunchConfig& config, const std::string& value)> apply;
};
const std::vector<ConfigFlag>& config_flags();
const ConfigFlag* find_config_flag(std::string_view name);
// "  --num_processes N   help" lines for the usage texts.
std::string describe_config_flags();

// Splits "--name=value" / "--name" into the normalised name and the inline value, if any.
// Returns false when `arg` is not a long flag.
bool split_flag(std::string_view arg, std::string& name, std::string& value, bool& has_value);

// Strict parsers for flag values and interactive answers: the whole text must be the value.
int parse_int(const std::string& text, const std::string& what);
bool parse_bool(const std::string& text, const std::string& what);

}  // namespace ember::cli
