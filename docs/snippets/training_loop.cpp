// The single-device training loop of docs/quickstart.md: an nn module, an optimizer, a
// DataLoader. A small MLP learns y = 3*x0 - 2*x1 + 0.5; the program prints the last epoch's
// mean loss and exits 0 when it fell below 0.01 (the docs test runs it).
#include <ember/ember.h>

#include <cstdio>
#include <memory>

using namespace ember;

// [model]
// A module owns its parameters and submodules under names, as torch.nn.Module does.
struct Regressor : nn::Module {
  std::shared_ptr<nn::Linear> hidden, out;
  Regressor() : Module("Regressor") {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(2, 32));
    out = register_module("out", std::make_shared<nn::Linear>(32, 1));
  }
  Tensor forward(const Tensor& x) override { return out->forward(relu(hidden->forward(x))); }
};

// Rows of x [n, 2] and y [n, 1], served as {"x": ..., "y": ...} examples.
std::shared_ptr<data::TensorDataset> make_dataset(int64_t n) {
  Tensor x = randn({n, 2});
  Tensor y = matmul(x, from_vector<float>({3, -2}, {2, 1})) + 0.5;
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", x}, {"y", y}});
}
// [/model]

int main() {
  // [loop]
  manual_seed(0);
  auto model = std::make_shared<Regressor>();
  optim::AdamW opt(model->parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  data::DataLoader loader(make_dataset(1024), {.batch_size = 32, .shuffle = true});
  double epoch_loss = 0;
  for (int epoch = 0; epoch < 20; ++epoch) {
    loader.set_epoch(epoch);  // a new shuffle order each epoch
    epoch_loss = 0;
    for (auto& batch : loader) {
      Tensor loss = nn::functional::mse_loss(model->forward(batch["x"]), batch["y"]);
      loss.backward();
      opt.step();
      opt.zero_grad();
      epoch_loss += loss.item<double>() / double(loader.size());
    }
  }
  std::printf("final epoch: mean loss %.4f\n", epoch_loss);
  // [/loop]
  return epoch_loss < 0.01 ? 0 : 1;
}
