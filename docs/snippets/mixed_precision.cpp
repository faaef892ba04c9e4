// Mixed precision, with and without the Accelerator (docs/quickstart.md): a prepared model's
// forward autocasts by itself, acc.autocast() covers code outside the model, and fp16 adds its
// loss scaler. Prints what ran in which dtype, and the loss scale of the fp16 run.
#include <ember/accelerate.h>
#include <ember/ember.h>

#include <cstdio>
#include <memory>

using namespace ember;

std::shared_ptr<data::TensorDataset> make_dataset(int64_t n) {
  Tensor x = randn({n, 8});
  Tensor y = matmul(x, full({8, 1}, 0.25));
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", x}, {"y", y}});
}

int main() {
  manual_seed(0);
  {
    // [plain-autocast]
    // PyTorch's torch.autocast("cpu", dtype=torch.bfloat16), without the Accelerator:
    auto model = std::make_shared<nn::Linear>(8, 1);
    Tensor x = randn({16, 8}), y = zeros({16, 1});
    Tensor loss;
    {
      AutocastGuard autocast(DeviceType::CPU, DType::bf16);  // linear/matmul/bmm in bf16
      loss = nn::functional::mse_loss(model->forward(x), y);  // losses compute in f32
    }
    loss.backward();  // outside the scope; gradients arrive in f32 on the f32 parameters
    // [/plain-autocast]
    std::printf("plain autocast: loss dtype %s, weight grad dtype %s\n", dtype_name(loss.dtype()),
                dtype_name(model->weight.grad().dtype()));
  }
  {
    // [accelerator-bf16]
    Accelerator acc({.mixed_precision = "bf16"});  // or `ember launch --mixed_precision bf16`
    auto model = std::make_shared<nn::Linear>(8, 1);
    optim::AdamW opt(model->parameters(), {.lr = 1e-2});
    data::DataLoader loader(make_dataset(256), {.batch_size = 32});
    auto [m, o, l] = acc.prepare(model, opt, loader);
    for (auto& batch : *l) {
      Tensor out = m->forward(batch["x"]);                      // a prepared model autocasts: bf16
      Tensor loss = nn::functional::mse_loss(out, batch["y"]);  // losses compute in f32
      acc.backward(loss);                                       // backward never autocasts
      o->step();
      o->zero_grad();
    }
    // [/accelerator-bf16]
    const DType forward_dtype = m->forward(randn({2, 8})).dtype();

    // [autocast-scope]
    // Code outside the prepared model: Accelerate's `with accelerator.autocast():`
    Tensor features = randn({4, 8});
    Tensor scores;
    {
      auto autocast = acc.autocast();
      scores = matmul(features, features.t());  // bf16
    }
    // [/autocast-scope]

    // [autocast-off]
    // Only acc.autocast() scopes autocast (Accelerate's AutocastKwargs(enabled=False)):
    Accelerator manual({.mixed_precision = "bf16", .autocast_prepared_model = false});
    auto plain = manual.prepare(std::make_shared<nn::Linear>(8, 1));
    Tensor f32_out = plain->forward(features);  // f32
    // [/autocast-off]
    acc.print("bf16: prepared forward", dtype_name(forward_dtype), "| acc.autocast() matmul", dtype_name(scores.dtype()),
              "| autocast_prepared_model = false:", dtype_name(f32_out.dtype()));
  }
  {
    // [accelerator-fp16]
    // fp16 adds dynamic loss scaling (Accelerate's GradScalerKwargs -> .scaler).
    Accelerator acc({.mixed_precision = "fp16", .scaler = {.init_scale = 1024.0, .growth_interval = 100}});
    auto model = std::make_shared<nn::Linear>(8, 1);
    optim::AdamW opt(model->parameters(), {.lr = 1e-2});
    data::DataLoader loader(make_dataset(256), {.batch_size = 32});
    auto [m, o, l] = acc.prepare(model, opt, loader);
    int64_t skipped = 0;
    for (auto& batch : *l) {
      Tensor loss = nn::functional::mse_loss(m->forward(batch["x"]), batch["y"]);  // f16 forward
      acc.backward(loss);                           // backpropagates loss * scale
      acc.clip_grad_norm_(m->parameters(), 1.0);    // unscales first, returns the true norm
      o->step();                                    // skipped when a gradient overflowed
      if (acc.optimizer_step_was_skipped()) ++skipped;
      o->zero_grad();
    }
    acc.print("fp16: loss scale", acc.scaler()->get_scale(), "with", skipped, "steps skipped");
    // [/accelerator-fp16]
  }
  return 0;
}
