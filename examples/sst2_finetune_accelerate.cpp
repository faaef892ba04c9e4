// SST-2 sentiment fine-tuning with the Accelerator: sst2_finetune.cpp plus the lines marked
// "// +". The same binary runs on one process, or on several under `ember launch`:
//
//   build/examples/sst2_finetune_accelerate
//   build/bin/ember launch --num_processes 2 build/examples/sst2_finetune_accelerate
//
// split_batches keeps --batch the global batch size: with N processes each takes 1/N of every
// batch, so the optimisation (and the learning-rate schedule) is that of the one-process run.
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "sst2_common.h"
#include <ember/accelerate.h>  // +

using namespace ember;

int main(int argc, char** argv) try {
  const sst2::Options opt = sst2::parse(argc, argv, "sst2_finetune_accelerate");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines show up as they are printed
  if (opt.threads > 0) set_num_threads(opt.threads);
  manual_seed(opt.seed);
  Accelerator acc({.split_batches = true});  // +
  const sst2::Data sst = sst2::load(opt);
  auto model = sst2::model(opt, sst);
  optim::AdamW optimizer(model->parameters(), {.lr = opt.lr, .weight_decay = 0.01});
  data::DataLoader train_loader = sst2::train_loader(opt, sst);
  data::DataLoader dev_loader = sst2::eval_loader(sst);
  const int64_t steps = opt.epochs * train_loader.size();
  auto scheduler = optim::get_scheduler("linear", optimizer, steps / 10, steps);
  auto [m, o, train, dev, s] = acc.prepare(model, optimizer, train_loader, dev_loader, scheduler);  // +

  for (int64_t epoch = 0; epoch < opt.epochs; ++epoch) {
    m->train();
    train->set_epoch(epoch);
    int64_t step = 0;
    for (auto& batch : *train) {
      auto out = m->forward(batch);
      acc.backward(out.loss);                       // +
      acc.clip_grad_norm_(m->parameters(), 1.0);    // +
      o->step();
      s->step();
      o->zero_grad();
      if (++step % 200 == 0) acc.print("epoch ", epoch + 1, " step ", step, ": loss ", out.loss.item<double>());
    }

    m->eval();
    NoGradGuard no_grad;
    int64_t correct = 0, total = 0;
    for (auto& batch : *dev) {
      Tensor predictions = acc.gather_for_metrics(argmax(m->forward(batch).logits, -1));  // +
      Tensor labels = acc.gather_for_metrics(batch.at("labels"));                          // +
      correct += sum(eq(predictions, labels)).item<int64_t>();
      total += labels.numel();
    }
    char line[128];
    std::snprintf(line, sizeof line, "epoch %lld: SST-2 dev accuracy %.2f%% (%lld sentences, %d processes)",
                  (long long)epoch + 1, 100.0 * double(correct) / double(total), (long long)total, acc.num_processes());
    acc.print(line);
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
