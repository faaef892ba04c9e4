// The training loop of training_loop.cpp with the Accelerator lines added (marked `// +`). The
// same binary runs as one process, or as several under
//   ember launch --num_processes 2 ./snippet_accelerate_loop
// where each process reads its share of every epoch and DDP averages the gradients. The main
// process prints the last epoch's loss (averaged over the processes); exit 0 when it is below 0.01.
#include <ember/accelerate.h>  // +
#include <ember/ember.h>

#include <cstdio>
#include <memory>

using namespace ember;

struct Regressor : nn::Module {
  std::shared_ptr<nn::Linear> hidden, out;
  Regressor() : Module("Regressor") {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(2, 32));
    out = register_module("out", std::make_shared<nn::Linear>(32, 1));
  }
  Tensor forward(const Tensor& x) override { return out->forward(relu(hidden->forward(x))); }
};

std::shared_ptr<data::TensorDataset> make_dataset(int64_t n) {
  Tensor x = randn({n, 2});
  Tensor y = matmul(x, from_vector<float>({3, -2}, {2, 1})) + 0.5;
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", x}, {"y", y}});
}

int main() {
  // [loop]
  Accelerator acc;                                                   // +
  acc.set_seed(0);                                                   // + every process: the same model and data
  auto model = std::make_shared<Regressor>();
  optim::AdamW opt(model->parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  data::DataLoader loader(make_dataset(1024), {.batch_size = 32, .shuffle = true});
  auto [m, o, l] = acc.prepare(model, opt, loader);                  // +
  double epoch_loss = 0;
  for (int epoch = 0; epoch < 20; ++epoch) {
    l->set_epoch(epoch);
    double loss_sum = 0;
    for (auto& batch : *l) {                                         // batches arrive on acc.device()
      Tensor loss = nn::functional::mse_loss(m->forward(batch["x"]), batch["y"]);
      acc.backward(loss);                                            // + was loss.backward()
      o->step();
      o->zero_grad();
      loss_sum += loss.item<double>();
    }
    // + the mean over every process's batches
    epoch_loss = acc.reduce(scalar_tensor(loss_sum / double(l->size())), "mean").item<double>();
  }
  acc.print("final epoch: mean loss", epoch_loss, "over", acc.num_processes(), "processes");  // + (spaces between, as print())
  // [/loop]
  return epoch_loss < 0.01 ? 0 : 1;
}
