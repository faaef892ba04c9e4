// Gradient accumulation, clipping, schedulers and DDP's no_sync with the Accelerator
// (docs/accelerate_mapping.md). One process or several under `ember launch`.
#include <ember/accelerate.h>
#include <ember/ember.h>

#include <cstdio>
#include <memory>

using namespace ember;

std::shared_ptr<data::TensorDataset> make_dataset(int64_t n) {
  Tensor x = randn({n, 8});
  Tensor y = matmul(x, full({8, 1}, 0.5));
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", x}, {"y", y}});
}

int main() {
  // [accumulate]
  Accelerator acc({.gradient_accumulation_steps = 4});
  acc.set_seed(0);
  auto model = std::make_shared<nn::Linear>(8, 1);
  optim::AdamW opt(model->parameters(), {.lr = 1e-2});
  data::DataLoader loader(make_dataset(512), {.batch_size = 16, .shuffle = true});
  const int64_t epochs = 2;
  // Size the schedule for one process reading the un-prepared loader (docs/accelerate_semantics.md).
  const int64_t updates = epochs * loader.size() / acc.gradient_accumulation_steps();
  auto sched = optim::get_scheduler("linear", opt, updates / 10, updates);
  auto [m, o, l, s] = acc.prepare(model, opt, loader, sched);
  for (int64_t epoch = l->epoch(); epoch < epochs; ++epoch) {
    l->set_epoch(epoch);
    for (auto& batch : *l) {
      auto guard = acc.accumulate(m);                 // `with accelerator.accumulate(model):`
      Tensor loss = nn::functional::mse_loss(m->forward(batch["x"]), batch["y"]);
      acc.backward(loss);                             // loss / 4, gradients add up
      if (acc.sync_gradients()) {                     // the window's last micro-step
        acc.clip_grad_norm_(m->parameters(), 1.0);    // or acc.clip_grad_value_(m->parameters(), 0.5)
      }
      o->step();                                      // a no-op until sync_gradients()
      s->step();
      o->zero_grad();
    }
  }
  // [/accumulate]

  // [no-sync]
  // By hand, without accumulate(): keep gradients local for a micro-step, then synchronise.
  Tensor x = randn({16, 8}), y = zeros({16, 1});
  {
    auto local = acc.no_sync(m);
    acc.backward(nn::functional::mse_loss(m->forward(x), y));  // no all-reduce
  }
  acc.backward(nn::functional::mse_loss(m->forward(x), y));    // all-reduces the sum
  acc.unscale_gradients();  // fp16: divide the gradients by the loss scale now (nothing otherwise)
  acc.clip_grad_value_(m->parameters(), 0.5);
  o->zero_grad();
  // [/no-sync]

  acc.print("schedule steps:", s->last_step(), "| lr now", s->get_last_lr()[0],
            "| micro-steps in the open window:", acc.step());
  return 0;
}
