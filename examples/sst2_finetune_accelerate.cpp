// SST-2 sentiment fine-tuning with the Accelerator: sst2_finetune.cpp plus the lines marked
// "// +". The same binary runs on one process, or on several under `ember launch`:
//
//   build/examples/sst2_finetune_accelerate
//   build/bin/ember launch --num_processes 2 build/examples/sst2_finetune_accelerate
//
// The run is logged under runs/sst2_finetune_accelerate/ (--project-dir): metrics.jsonl,
// TensorBoard events (`tensorboard --logdir runs`) and, at the end, report.html.
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
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // result lines show up as they are printed
  if (opt.threads > 0) set_num_threads(opt.threads);
  manual_seed(opt.seed);
  Accelerator acc({.split_batches = true,                                                            // +
                   .log_with = {"all"},                                                               // +
                   .project_dir = opt.project_dir,                                                    // +
                   .ddp = {.comm_hook = distributed::parse_comm_hook(opt.comm_hook),                  // +
                           .powersgd = {.matrix_approximation_rank = opt.powersgd_rank}}});           // +
  const sst2::Data sst = sst2::load(opt);
  auto model = sst2::model(opt, sst);
  optim::AdamW optimizer(model->parameters(), {.lr = opt.lr, .weight_decay = 0.01});
  data::DataLoader train_loader = sst2::train_loader(opt, sst);
  data::DataLoader dev_loader = sst2::eval_loader(sst);
  const int64_t steps = opt.epochs * train_loader.size();
  auto scheduler = optim::get_scheduler("linear", optimizer, steps / 10, steps);
  auto [m, o, train, dev, s] = acc.prepare(model, optimizer, train_loader, dev_loader, scheduler);  // +
  acc.init_trackers("sst2_finetune_accelerate", {{"lr", opt.lr}, {"batch", opt.batch}, {"epochs", opt.epochs},  // +
                                                 {"processes", acc.num_processes()}});                         // +
  int64_t global_step = 0;                                                                                     // +

  for (int64_t epoch = 0; epoch < opt.epochs; ++epoch) {
    m->train();
    train->set_epoch(epoch);
    ProgressBar bar("epoch " + std::to_string(epoch + 1) + " train", train->size(), "batch");
    int64_t step = 0;
    for (auto& batch : *train) {
      auto out = m->forward(batch);
      acc.backward(out.loss);                       // +
      acc.clip_grad_norm_(m->parameters(), 1.0);    // +
      o->step();
      s->step();
      o->zero_grad();
      bar.update(++step, sst2::loss_postfix(out.loss));
      if (++global_step % 20 == 0) acc.log({{"loss", out.loss.item<double>()}, {"lr", s->get_last_lr()[0]}}, global_step);  // +
    }
    bar.finish();

    m->eval();
    NoGradGuard no_grad;
    int64_t correct = 0, total = 0, evaluated = 0;
    ProgressBar eval_bar("epoch " + std::to_string(epoch + 1) + " dev", dev->size(), "batch");
    for (auto& batch : *dev) {
      Tensor predictions = acc.gather_for_metrics(argmax(m->forward(batch).logits, -1));  // +
      Tensor labels = acc.gather_for_metrics(batch.at("labels"));                          // +
      correct += sum(eq(predictions, labels)).item<int64_t>();
      total += labels.numel();
      eval_bar.update(++evaluated);
    }
    eval_bar.finish();
    char line[128];
    std::snprintf(line, sizeof line, "epoch %lld: SST-2 dev accuracy %.2f%% (%lld sentences, %d processes)",
                  (long long)epoch + 1, 100.0 * double(correct) / double(total), (long long)total, acc.num_processes());
    acc.print(line);
    acc.log({{"dev_accuracy", double(correct) / double(total)}}, global_step);  // +
  }
  acc.end_training();  // + (also writes <project_dir>/sst2_finetune_accelerate/report.html)
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
