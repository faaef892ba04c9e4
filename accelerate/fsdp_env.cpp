#include "accelerate/fsdp_env.h"

#include <cstdlib>

#include "accelerate/fsdp_settings.h"
#include "core/error.h"

namespace ember::distributed {

namespace {

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  return std::string(value);
}

// Reads `name` into `options` through `setting`, naming the variable when the value is bad.
void apply_variable(const char* name, const FSDPSetting& setting, FSDPOptions& options) {
  const std::optional<std::string> value = variable(name);
  if (!value) return;
  try {
    setting.parse(options, *value);
  } catch (const Error& e) {
    EMBER_FAIL(name, "='", *value, "': ", e.what());
  }
}

}  // namespace

std::optional<FSDPOptions> fsdp_options_from_env() {
  const std::optional<std::string> use = variable("EMBER_USE_FSDP");
  if (!use) return std::nullopt;
  bool on = false;
  try {
    on = parse_fsdp_bool(*use);
  } catch (const Error& e) {
    EMBER_FAIL("EMBER_USE_FSDP='", *use, "': ", e.what());
  }
  if (!on) return std::nullopt;

  FSDPOptions options;
  for (const FSDPSetting& setting : fsdp_settings()) apply_variable(setting.variable, setting, options);
  // The field's own name, for those who write it after FSDPOptions::cpu_offload.
  apply_variable("EMBER_FSDP_CPU_OFFLOAD", *find_fsdp_setting("fsdp_offload_params"), options);
  return options;
}

std::vector<std::pair<std::string, std::string>> fsdp_env(const FSDPOptions& options) {
  std::vector<std::pair<std::string, std::string>> env = {{"EMBER_USE_FSDP", "true"}};
  for (const FSDPSetting& setting : fsdp_settings())
    if (const std::optional<std::string> text = setting.format(options)) env.emplace_back(setting.variable, *text);
  return env;
}

}  // namespace ember::distributed
