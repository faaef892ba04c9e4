// libFuzzer target: nn::JsonConfig (config.json) on arbitrary bytes: load from a file, then
// the typed getters a BERT config is read with. Only ember::Error may escape the reader.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "nn/io/json_config.h"

namespace {
template <typename T>
void try_get(const ember::nn::JsonConfig& c, const std::string& key) {
  try {
    (void)c.get_optional<T>(key);
  } catch (const ember::Error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ember::nn::JsonConfig;
  const std::string path = ember::fuzz::write_temp(data, size, "config", ".json");
  try {
    JsonConfig c = JsonConfig::load(path);
    // Parse the same bytes from memory too: both must agree.
    JsonConfig m = JsonConfig::parse(std::string_view(reinterpret_cast<const char*>(data), size), "mem");
    if (c.keys() != m.keys()) std::abort();
    for (const std::string& key : c.keys()) {
      try_get<bool>(c, key);
      try_get<int>(c, key);
      try_get<int64_t>(c, key);
      try_get<float>(c, key);
      try_get<double>(c, key);
      try_get<std::string>(c, key);
      try_get<std::vector<int>>(c, key);
      try_get<std::vector<int64_t>>(c, key);
      try_get<std::vector<double>>(c, key);
      try_get<std::vector<std::string>>(c, key);
      try_get<std::map<std::string, std::string>>(c, key);
      try_get<std::map<std::string, int64_t>>(c, key);
      try {
        (void)c.get_object(key).keys();
      } catch (const ember::Error&) {
      }
    }
    (void)c.dump();
  } catch (const ember::Error&) {
  }
  return 0;
}
