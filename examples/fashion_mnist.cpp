// Fashion-MNIST image classification with a small CNN (or a ResNet) and the Accelerator. The
// data is Debian's dataset-fashion-mnist package (installed by scripts/install_deps.sh); the
// same binary runs on one process or several:
//
//   build/examples/fashion_mnist                          # the CNN, 4 epochs or 4.5 minutes of training
//   build/bin/ember launch --num_processes 2 build/examples/fashion_mnist --sync-bn
//   build/examples/fashion_mnist --model resnet --epochs 3
//
// The lines marked "// +" are what the Accelerator adds to a single-device loop. --sync-bn
// converts every batch norm to SyncBatchNorm (statistics over the global batch), as
// torch.nn.SyncBatchNorm.convert_sync_batchnorm does. split_batches keeps --batch the global
// batch size, so N processes optimise as one does. Logged under runs/fashion_mnist/.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ember/accelerate.h>  // +

#include "fashion_cnn.h"

using namespace ember;

namespace {

struct Options {
  std::string model = "cnn";  // cnn | resnet
  int64_t epochs = 4;
  double minutes = 4.5;  // the training budget; the evaluations fit in the rest of 5 minutes
  int64_t batch = 128;
  double lr = 2e-3;
  int64_t train_limit = -1;
  bool sync_bn = false;
  uint64_t seed = 0;
  int threads = 0;
  std::string data_dir;  // default: Debian's /usr/share/datasets/fashion-mnist
  std::string project_dir = "runs";
  std::string save;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf("usage: fashion_mnist [--model cnn|resnet] [--epochs N] [--minutes M] [--batch B] [--lr X]\n"
                  "       [--train-limit N] [--sync-bn] [--seed S] [--threads T] [--data-dir D]\n"
                  "       [--project-dir D] [--save DIR]\n");
      std::exit(0);
    }
    if (k == "--sync-bn") {
      o.sync_bn = true;
      continue;
    }
    EMBER_CHECK(i + 1 < argc, "fashion_mnist: ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--model") o.model = v;
    else if (k == "--epochs") o.epochs = std::stoll(v);
    else if (k == "--minutes") o.minutes = std::stod(v);
    else if (k == "--batch") o.batch = std::stoll(v);
    else if (k == "--lr") o.lr = std::stod(v);
    else if (k == "--train-limit") o.train_limit = std::stoll(v);
    else if (k == "--seed") o.seed = std::stoull(v);
    else if (k == "--threads") o.threads = std::stoi(v);
    else if (k == "--data-dir") o.data_dir = v;
    else if (k == "--project-dir") o.project_dir = v;
    else if (k == "--save") o.save = v;
    else EMBER_FAIL("fashion_mnist: unknown option ", k, " (see --help)");
  }
  EMBER_CHECK(o.model == "cnn" || o.model == "resnet", "fashion_mnist: --model must be cnn or resnet, got ", o.model);
  EMBER_CHECK(o.epochs > 0 && o.batch > 0 && o.minutes > 0, "fashion_mnist: --epochs, --batch and --minutes must be positive");
  return o;
}

std::string loss_postfix(double loss, double images_per_s) {
  char text[64];
  std::snprintf(text, sizeof text, "loss %.4f | %.0f img/s", loss, images_per_s);
  return text;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (opt.threads > 0) set_num_threads(opt.threads);
  manual_seed(opt.seed);
  Accelerator acc({.split_batches = true, .log_with = {"all"}, .project_dir = opt.project_dir});  // +

  auto train_set = std::make_shared<data::IdxImageDataset>(data::fashion_mnist("train", opt.data_dir));
  auto test_set = std::make_shared<data::IdxImageDataset>(data::fashion_mnist("test", opt.data_dir));
  std::shared_ptr<data::Dataset> train_data = train_set;
  if (opt.train_limit >= 0 && opt.train_limit < train_set->size()) {
    std::vector<int64_t> first(static_cast<size_t>(opt.train_limit));
    for (int64_t i = 0; i < opt.train_limit; ++i) first[size_t(i)] = i;
    train_data = std::make_shared<data::Subset>(train_set, first);
  }

  std::shared_ptr<nn::Module> model;
  if (opt.model == "cnn") model = fashion_cnn();
  else model = std::make_shared<nn::ResNetForImageClassification>(nn::ResNetConfig::small_grey(10));
  if (opt.sync_bn) model = nn::convert_sync_batchnorm(model);  // + statistics over every process's batch
  auto logits_of = [&](const Tensor& pixels) { return model->forward(pixels); };

  optim::AdamW optimizer(model->parameters(), {.lr = opt.lr, .weight_decay = 0.01});
  data::DataLoader train_loader(train_data, {.batch_size = opt.batch, .shuffle = true, .seed = opt.seed});
  data::DataLoader test_loader(test_set, {.batch_size = 500});
  const int64_t total_steps = opt.epochs * train_loader.size();
  auto scheduler = optim::get_scheduler("cosine", optimizer, total_steps / 20, total_steps);
  auto [m, o, train, test, s] = acc.prepare(model, optimizer, train_loader, test_loader, scheduler);  // +
  acc.init_trackers("fashion_mnist", {{"model", opt.model}, {"lr", opt.lr}, {"batch", opt.batch},    // +
                                      {"epochs", opt.epochs}, {"sync_bn", opt.sync_bn ? 1 : 0},     // +
                                      {"processes", acc.num_processes()}});                          // +

  const auto start = std::chrono::steady_clock::now();
  auto minutes_so_far = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60; };
  int64_t global_step = 0, epochs_done = 0;
  bool out_of_time = false;
  double accuracy = 0;
  for (int64_t epoch = 0; epoch < opt.epochs && !out_of_time; ++epoch) {
    m->train();
    train->set_epoch(epoch);
    ProgressBar bar("epoch " + std::to_string(epoch + 1) + " train", train->size(), "batch");
    int64_t step = 0;
    const auto epoch_start = std::chrono::steady_clock::now();
    for (auto& batch : *train) {
      Tensor loss = cross_entropy(logits_of(batch.at("pixel_values")), batch.at("labels"));
      acc.backward(loss);  // +
      o->step();
      s->step();
      o->zero_grad();
      ++step;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      const double images_per_s = double(step * opt.batch) / seconds;
      bar.update(step, loss_postfix(loss.item<double>(), images_per_s));
      if (++global_step % 50 == 0)
        acc.log({{"loss", loss.item<double>()}, {"lr", s->get_last_lr()[0]}, {"images_per_s", images_per_s}},  // +
                global_step);
      // Every process stops at the same step: the budget is agreed on, not read from each clock.
      Tensor late = scalar_tensor(minutes_so_far() > opt.minutes ? 1.0 : 0.0, {DType::f32});
      if (acc.reduce(late, "sum").item<double>() > 0) {  // +
        out_of_time = true;
        break;
      }
    }
    bar.finish();
    epochs_done = epoch + 1;

    m->eval();
    NoGradGuard no_grad;
    int64_t correct = 0, total = 0;
    for (auto& batch : *test) {
      Tensor predictions = acc.gather_for_metrics(argmax(logits_of(batch.at("pixel_values")), -1));  // +
      Tensor labels = acc.gather_for_metrics(batch.at("labels"));                                    // +
      correct += sum(eq(predictions, labels)).item<int64_t>();
      total += labels.numel();
    }
    accuracy = double(correct) / double(total);
    char line[160];
    std::snprintf(line, sizeof line, "epoch %lld: Fashion-MNIST test accuracy %.2f%% (%lld images, %.1f min)%s",
                  (long long)epoch + 1, 100.0 * accuracy, (long long)total, minutes_so_far(),
                  out_of_time ? ", training budget reached" : "");
    acc.print(line);
    acc.log({{"test_accuracy", accuracy}}, global_step);  // +
  }
  if (!opt.save.empty()) acc.save_model(m, opt.save);
  char summary[200];
  std::snprintf(summary, sizeof summary,
                "fashion_mnist: %s, %lld epochs, %lld steps, %d processes%s: test accuracy %.2f%% in %.1f min",
                opt.model.c_str(), (long long)epochs_done, (long long)global_step, acc.num_processes(),
                opt.sync_bn ? " (SyncBatchNorm)" : "", 100.0 * accuracy, minutes_so_far());
  acc.print(summary);
  acc.end_training();  // +
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
