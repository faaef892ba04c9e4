// The small CNN of examples/fashion_mnist.cpp, shared with bench/models_train.cpp and its
// PyTorch peer (bench/models_train_peer.py builds the same layers).
#pragma once
#include <cstdint>
#include <memory>
#include <utility>

#include <ember/ember.h>

namespace ember {

// Two conv blocks (conv, batch norm, ReLU, 2x2 max pool) and a two-layer classifier.
inline std::shared_ptr<nn::Sequential> fashion_cnn() {
  auto conv = [](int64_t in, int64_t out) {
    return std::make_shared<nn::Conv2d>(nn::ConvOptions{.in_channels = in, .out_channels = out, .kernel_size = {3},
                                                        .padding = 1});
  };
  auto net = std::make_shared<nn::Sequential>();
  for (auto [in, out] : {std::pair<int64_t, int64_t>{1, 32}, {32, 64}}) {
    net->push_back(conv(in, out));
    net->push_back(std::make_shared<nn::BatchNorm2d>(out));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::MaxPool2d>(Shape{2}));
  }
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Dropout>(0.25));
  net->push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 128));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Dropout>(0.25));
  net->push_back(std::make_shared<nn::Linear>(128, 10));
  return net;
}

}  // namespace ember
