// ResNetConfig: the fields of Hugging Face's ResNetConfig (transformers' ResNetModel and
// ResNetForImageClassification), read from and written to config.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ember::nn {

class JsonConfig;

struct ResNetConfig {
  int64_t num_channels = 3;
  int64_t embedding_size = 64;
  std::vector<int64_t> hidden_sizes = {256, 512, 1024, 2048};
  std::vector<int64_t> depths = {3, 4, 6, 3};
  std::string layer_type = "bottleneck";  // "basic" (two 3x3 convolutions) or "bottleneck"
  std::string hidden_act = "relu";        // "relu", "silu"/"swish", "gelu", "tanh"
  bool downsample_in_first_stage = false;
  bool downsample_in_bottleneck = false;
  int64_t num_labels = 2;
  std::vector<std::string> architectures;

  // Small presets: ResNet-18's block layout, and one narrow enough for 28x28 grey images.
  static ResNetConfig resnet18(int64_t num_labels = 1000);
  static ResNetConfig small_grey(int64_t num_labels = 10);

  // Throws ember::Error naming the bad field: sizes positive and bounded, one depth per hidden
  // size, a known layer type and activation.
  void validate() const;
  static ResNetConfig from_json_file(const std::string& path);
  static ResNetConfig from_json_string(const std::string& text, const std::string& source = "<string>");
  JsonConfig to_json() const;
  std::string to_json_string() const;
};

}  // namespace ember::nn
