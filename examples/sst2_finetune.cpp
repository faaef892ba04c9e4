// SST-2 sentiment fine-tuning on one process: the training loop as a PyTorch user writes it.
// sst2_finetune_accelerate.cpp is the same program with the Accelerator lines added.
//
//   build/examples/sst2_finetune [--epochs 1] [--batch 32] [--lr 2e-4] [--pretrained DIR]
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "sst2_common.h"

using namespace ember;

int main(int argc, char** argv) try {
  const sst2::Options opt = sst2::parse(argc, argv, "sst2_finetune");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // result lines show up as they are printed
  if (opt.threads > 0) set_num_threads(opt.threads);
  manual_seed(opt.seed);
  const sst2::Data sst = sst2::load(opt);
  auto model = sst2::model(opt, sst);
  optim::AdamW optimizer(model->parameters(), {.lr = opt.lr, .weight_decay = 0.01});
  data::DataLoader train_loader = sst2::train_loader(opt, sst);
  data::DataLoader dev_loader = sst2::eval_loader(sst);
  const int64_t steps = opt.epochs * train_loader.size();
  auto scheduler = optim::get_scheduler("linear", optimizer, steps / 10, steps);

  for (int64_t epoch = 0; epoch < opt.epochs; ++epoch) {
    model->train();
    train_loader.set_epoch(epoch);
    ProgressBar bar("epoch " + std::to_string(epoch + 1) + " train", train_loader.size(), "batch");
    int64_t step = 0;
    for (auto& batch : train_loader) {
      auto out = model->forward(batch);
      out.loss.backward();
      optim::clip_grad_norm_(model->parameters(), 1.0);
      optimizer.step();
      scheduler->step();
      optimizer.zero_grad();
      bar.update(++step, sst2::loss_postfix(out.loss));
    }
    bar.finish();

    model->eval();
    NoGradGuard no_grad;
    int64_t correct = 0, total = 0, evaluated = 0;
    ProgressBar eval_bar("epoch " + std::to_string(epoch + 1) + " dev", dev_loader.size(), "batch");
    for (auto& batch : dev_loader) {
      Tensor predictions = argmax(model->forward(batch).logits, -1);
      Tensor labels = batch.at("labels");
      correct += sum(eq(predictions, labels)).item<int64_t>();
      total += labels.numel();
      eval_bar.update(++evaluated);
    }
    eval_bar.finish();
    std::printf("epoch %lld: SST-2 dev accuracy %.2f%% (%lld sentences)\n", (long long)epoch + 1,
                100.0 * double(correct) / double(total), (long long)total);
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
