// The FSDPOptions fields as text, one table for the three places that spell them: the
// `fsdp_config:` mapping of a launch config (launch_config.h), the `ember launch --fsdp_*` flags,
// and the EMBER_FSDP_* variables the launcher hands every rank (fsdp_env.h). The names follow
// Hugging Face Accelerate: its YAML keys and flags are fsdp_<name>, its variables FSDP_<NAME>
// (EMBER_ in front here), and the two differ for the wrapped classes
// (fsdp_transformer_layer_cls_to_wrap / FSDP_TRANSFORMER_CLS_TO_WRAP).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/fsdp_options.h"

namespace ember::distributed {

struct FSDPSetting {
  const char* key;       // YAML key and launch flag: "fsdp_sharding_strategy"
  const char* variable;  // environment variable: "EMBER_FSDP_SHARDING_STRATEGY"
  const char* accepted;  // what parse takes, for usage texts: "FULL_SHARD|SHARD_GRAD_OP|..."
  const char* help;
  // Sets the field from `text`; throws ember::Error naming the value and the accepted ones
  // (the caller puts the key or variable in front).
  void (*parse)(FSDPOptions& options, const std::string& text);
  // The field as parse reads it; nullopt when it is left to its default (not written out).
  std::optional<std::string> (*format)(const FSDPOptions& options);
};

// Every setting, in the order configs and environments are written.
const std::vector<FSDPSetting>& fsdp_settings();
const FSDPSetting* find_fsdp_setting(std::string_view key);
// "fsdp_sharding_strategy, fsdp_auto_wrap_policy, ...", for unknown-key messages.
std::string fsdp_setting_keys();

// Booleans as the variables, flags and YAML files write them: true/false, 1/0, yes/no (any case).
bool parse_fsdp_bool(const std::string& text);

// Applies every setting's format then parse to `options`, so a value set in code that no file
// could hold (min_num_params 0, cpu_offload on) is refused as a file's would be; the message
// starts with `source` and the key.
void check_fsdp_options(const FSDPOptions& options, const std::string& source);

}  // namespace ember::distributed
