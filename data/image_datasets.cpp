#include "data/image_datasets.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/factory.h"
#include "data/idx_file.h"

namespace ember::data {

std::string fashion_mnist_dir() {
  const char* env = std::getenv("EMBER_FASHION_MNIST_DIR");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

IdxImageDataset::IdxImageDataset(const std::string& images_path, const std::string& labels_path,
                                 IdxImageOptions options)
    : options_(options) {
  EMBER_CHECK(options.num_classes >= 1, "IdxImageDataset: num_classes must be positive, got ",
              options.num_classes);
  EMBER_CHECK(options.std > 0, "IdxImageDataset: std must be positive, got ", options.std);
  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  EMBER_CHECK(images.type == IdxType::u8 && images.dims.size() == 3, "IdxImageDataset: '", images_path,
              "' must hold [N, H, W] unsigned bytes, it holds ", images.dims.size(), " dimensions of ",
              idx_type_name(images.type));
  EMBER_CHECK(labels.type == IdxType::u8 && labels.dims.size() == 1, "IdxImageDataset: '", labels_path,
              "' must hold [N] unsigned bytes, it holds ", labels.dims.size(), " dimensions of ",
              idx_type_name(labels.type));
  EMBER_CHECK(images.dims[0] == labels.dims[0], "IdxImageDataset: '", images_path, "' holds ",
              images.dims[0], " images but '", labels_path, "' holds ", labels.dims[0], " labels");
  height_ = images.dims[1];
  width_ = images.dims[2];
  labels_.reserve(labels.bytes.size());
  for (size_t i = 0; i < labels.bytes.size(); ++i) {
    int64_t label = labels.bytes[i];
    EMBER_CHECK(label < options.num_classes, "IdxImageDataset: '", labels_path, "' label ", i, " is ",
                label, ", outside [0, ", options.num_classes, ")");
    labels_.push_back(label);
  }
  pixels_ = std::move(images.bytes);
}

Example IdxImageDataset::get(int64_t index) const {
  EMBER_CHECK(index >= 0 && index < size(), "IdxImageDataset: index ", index, " out of range [0, ",
              size(), ")");
  const int64_t plane = height_ * width_;
  Tensor image = empty({1, height_, width_}, {DType::f32});
  float* out = image.data_ptr<float>();
  const uint8_t* src = pixels_.data() + index * plane;
  const float scale = float(1.0 / (255.0 * options_.std));
  const float shift = float(options_.mean / options_.std);
  for (int64_t i = 0; i < plane; ++i) out[i] = float(src[i]) * scale - shift;
  Example e;
  e["pixel_values"] = image;
  e["labels"] = scalar_tensor(double(labels_[size_t(index)]), {DType::i64});
  return e;
}

IdxImageDataset fashion_mnist(const std::string& split, const std::string& dir) {
  EMBER_CHECK(split == "train" || split == "test", "fashion_mnist: split must be \"train\" or \"test\", got \"",
              split, "\"");
  std::string root = dir.empty() ? fashion_mnist_dir() : dir;
  std::string prefix = root + "/" + (split == "train" ? "train" : "t10k");
  std::FILE* probe = std::fopen((prefix + "-images-idx3-ubyte.gz").c_str(), "rb");
  EMBER_CHECK(probe != nullptr, "fashion_mnist: no '", prefix,
              "-images-idx3-ubyte.gz'; Debian's dataset-fashion-mnist package provides it "
              "(bash scripts/install_deps.sh installs it), or set EMBER_FASHION_MNIST_DIR");
  std::fclose(probe);
  IdxImageOptions options;
  options.mean = kFashionMnistMean;
  options.std = kFashionMnistStd;
  return IdxImageDataset(prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz", options);
}

}  // namespace ember::data
