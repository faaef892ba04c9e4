// libFuzzer target: distributed::LaunchConfig::load_yaml (the `ember config` file) on arbitrary
// bytes. A file that loads must survive a save/load round trip unchanged.
#include "accelerate/launch_config.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ember::distributed::LaunchConfig;
  const std::string path = ember::fuzz::write_temp(data, size, "yaml", ".yaml");
  try {
    LaunchConfig c = LaunchConfig::load_yaml(path);
    (void)c.distributed_type();
    (void)c.local_processes();
    (void)c.master_address();
    const std::string yaml = c.to_yaml();
    const std::string again = ember::fuzz::write_temp(reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size(),
                                                      "yaml_rt", ".yaml");
    if (LaunchConfig::load_yaml(again).to_yaml() != yaml) std::abort();
  } catch (const ember::Error&) {
  }
  return 0;
}
