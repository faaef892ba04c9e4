#include "nn/models/resnet_config.h"

#include <map>

#include "core/error.h"
#include "nn/io/json_config.h"
#include "nn/models/config_fields.h"

namespace ember::nn {

ResNetConfig ResNetConfig::resnet18(int64_t num_labels) {
  ResNetConfig c;
  c.hidden_sizes = {64, 128, 256, 512};
  c.depths = {2, 2, 2, 2};
  c.layer_type = "basic";
  c.num_labels = num_labels;
  return c;
}

ResNetConfig ResNetConfig::small_grey(int64_t num_labels) {
  ResNetConfig c;
  c.num_channels = 1;
  c.embedding_size = 32;
  c.hidden_sizes = {32, 64};
  c.depths = {1, 1};
  c.layer_type = "basic";
  c.num_labels = num_labels;
  return c;
}

// Bounds that keep every product of sizes far from overflow and refuse an absurd config.json
// before anything is allocated.
constexpr int64_t kMaxChannels = int64_t(1) << 16;
constexpr int64_t kMaxStages = 64;
constexpr int64_t kMaxDepth = 1024;

void ResNetConfig::validate() const {
  auto size = [](const std::string& name, int64_t v, int64_t bound) {
    EMBER_CHECK(v > 0 && v <= bound, "ResNetConfig: ", name, " must be in [1, ", bound, "], got ", v);
  };
  size("num_channels", num_channels, kMaxChannels);
  size("embedding_size", embedding_size, kMaxChannels);
  size("num_labels", num_labels, int64_t(1) << 24);
  EMBER_CHECK(!hidden_sizes.empty() && int64_t(hidden_sizes.size()) <= kMaxStages,
              "ResNetConfig: hidden_sizes must list 1 to ", kMaxStages, " stages, got ", hidden_sizes.size());
  EMBER_CHECK(depths.size() == hidden_sizes.size(), "ResNetConfig: depths has ", depths.size(),
              " entries but hidden_sizes has ", hidden_sizes.size(), " (one depth per stage)");
  for (size_t i = 0; i < hidden_sizes.size(); ++i) {
    size("hidden_sizes[" + std::to_string(i) + "]", hidden_sizes[i], kMaxChannels);
    size("depths[" + std::to_string(i) + "]", depths[i], kMaxDepth);
    if (layer_type == "bottleneck")
      EMBER_CHECK(hidden_sizes[i] % 4 == 0, "ResNetConfig: hidden_sizes[", i, "] = ", hidden_sizes[i],
                  " must be a multiple of 4 for bottleneck layers (they reduce the width by 4)");
  }
  EMBER_CHECK(layer_type == "basic" || layer_type == "bottleneck", "ResNetConfig: layer_type '", layer_type,
              "' is not one of basic, bottleneck");
  EMBER_CHECK(hidden_act == "relu" || hidden_act == "silu" || hidden_act == "swish" || hidden_act == "gelu" ||
                  hidden_act == "tanh",
              "ResNetConfig: unsupported hidden_act '", hidden_act, "' (relu, silu, swish, gelu, tanh)");
}

namespace {
ResNetConfig from_config(const JsonConfig& j) {
  ResNetConfig c;
  if (j.contains("model_type")) {
    const auto mt = j.get<std::string>("model_type");
    EMBER_CHECK(mt == "resnet", j.source(), ": model_type is '", mt, "', expected 'resnet'");
  }
  c.num_channels = j.get<int64_t>("num_channels", c.num_channels);
  c.embedding_size = j.get<int64_t>("embedding_size", c.embedding_size);
  c.hidden_sizes = j.get<std::vector<int64_t>>("hidden_sizes", c.hidden_sizes);
  c.depths = j.get<std::vector<int64_t>>("depths", c.depths);
  c.layer_type = j.get<std::string>("layer_type", c.layer_type);
  c.hidden_act = j.get<std::string>("hidden_act", c.hidden_act);
  c.downsample_in_first_stage = j.get<bool>("downsample_in_first_stage", c.downsample_in_first_stage);
  c.downsample_in_bottleneck = j.get<bool>("downsample_in_bottleneck", c.downsample_in_bottleneck);
  c.num_labels = read_num_labels(j, c.num_labels);
  c.architectures = j.get<std::vector<std::string>>("architectures", {});
  validate_read_config(j, [&] { c.validate(); });
  return c;
}
}  // namespace

ResNetConfig ResNetConfig::from_json_file(const std::string& path) { return from_config(JsonConfig::load(path)); }

ResNetConfig ResNetConfig::from_json_string(const std::string& text, const std::string& source) {
  return from_config(JsonConfig::parse(text, source));
}

JsonConfig ResNetConfig::to_json() const {
  JsonConfig j;
  j.set("model_type", std::string("resnet"));
  j.set("num_channels", num_channels);
  j.set("embedding_size", embedding_size);
  j.set("hidden_sizes", hidden_sizes);
  j.set("depths", depths);
  j.set("layer_type", layer_type);
  j.set("hidden_act", hidden_act);
  j.set("downsample_in_first_stage", downsample_in_first_stage);
  j.set("downsample_in_bottleneck", downsample_in_bottleneck);
  write_default_labels(j, num_labels);
  if (!architectures.empty()) j.set("architectures", architectures);
  return j;
}

std::string ResNetConfig::to_json_string() const { return to_json().dump(); }

}  // namespace ember::nn
