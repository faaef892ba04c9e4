// Image classification datasets stored as IDX pairs (MNIST, Fashion-MNIST): one file of
// [N, H, W] unsigned-byte images and one of N unsigned-byte labels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace ember::data {

// Where Debian's dataset-fashion-mnist package puts the files (scripts/debian-packages.txt
// installs it); EMBER_FASHION_MNIST_DIR overrides it.
std::string fashion_mnist_dir();

struct IdxImageOptions {
  int64_t num_classes = 10;
  // Pixels are scaled to [0, 1], then (x - mean) / std. The defaults leave them in [0, 1].
  double mean = 0.0;
  double std = 1.0;
};

// Fields of each example: "pixel_values" [1, H, W] f32 and "labels" (0-d i64). The images stay
// in memory as bytes (47 MB for Fashion-MNIST's training split) and become f32 per example.
class IdxImageDataset : public Dataset {
 public:
  IdxImageDataset(const std::string& images_path, const std::string& labels_path,
                  IdxImageOptions options = {});
  int64_t size() const override { return int64_t(labels_.size()); }
  Example get(int64_t index) const override;
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  const std::vector<int64_t>& labels() const { return labels_; }

 private:
  IdxImageOptions options_;
  int64_t height_ = 0;
  int64_t width_ = 0;
  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
};

// Fashion-MNIST's "train" (60,000 images) or "test" (10,000) split from `dir`
// (fashion_mnist_dir() when empty), normalised with the training set's mean and std.
IdxImageDataset fashion_mnist(const std::string& split, const std::string& dir = "");

// The training split's pixel mean and standard deviation (after scaling to [0, 1]).
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;

}  // namespace ember::data
