// Training-step benchmark of the first-week models, Ember's side of bench/compare_models_train.sh:
// the Fashion-MNIST CNN (examples/fashion_cnn.h, batch 128 of 28x28 images) or the byte-level
// GPT-2 of examples/gpt_text.cpp (vocab 257), with AdamW, f32 or bf16 autocast. Prints one JSON
// line {"kind": "result", "median_step_ms": ..., "items_per_s": ...} (images/s or tokens/s), as
// bench/models_train_peer.py does for PyTorch.
//
//   build/bench/models_train --model cnn --dtype f32 --threads 2
//   build/bench/models_train --model gpt --dtype bf16 --threads 2 --n-embd 128 --n-layer 4
//   build/bench/models_train --model gpt --device cuda --dtype bf16 --vocab 50257 --seq 1024 \
//       --n-embd 768 --n-layer 12 --n-head 12 --batch 8        # GPT-2 124M on a GPU
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ember/ember.h>

#include "../examples/fashion_cnn.h"

using namespace ember;

namespace {

struct Options {
  std::string model;
  std::string dtype = "f32";
  std::string device = "cpu";
  int64_t vocab = 257;  // the byte-level tokenizer's; 50257 for GPT-2's own
  int threads = 2;
  int64_t batch = 0;  // 0: 128 images (cnn), 32 sequences (gpt)
  int64_t seq = 128;
  int64_t n_embd = 128, n_layer = 4, n_head = 4;  // examples/gpt_text.cpp's defaults
  int warmup = 3, steps = 10;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    EMBER_CHECK(i + 1 < argc, "models_train: ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--model") o.model = v;
    else if (k == "--dtype") o.dtype = v;
    else if (k == "--device") o.device = v;
    else if (k == "--vocab") o.vocab = std::stoll(v);
    else if (k == "--threads") o.threads = std::stoi(v);
    else if (k == "--batch") o.batch = std::stoll(v);
    else if (k == "--seq") o.seq = std::stoll(v);
    else if (k == "--n-embd") o.n_embd = std::stoll(v);
    else if (k == "--n-layer") o.n_layer = std::stoll(v);
    else if (k == "--n-head") o.n_head = std::stoll(v);
    else if (k == "--warmup") o.warmup = std::stoi(v);
    else if (k == "--steps") o.steps = std::stoi(v);
    else EMBER_FAIL("models_train: unknown option ", k);
  }
  EMBER_CHECK(o.model == "cnn" || o.model == "gpt", "models_train: --model must be cnn or gpt");
  EMBER_CHECK(o.dtype == "f32" || o.dtype == "bf16", "models_train: --dtype must be f32 or bf16");
  EMBER_CHECK(o.device == "cpu" || o.device == "cuda", "models_train: --device must be cpu or cuda");
  EMBER_CHECK(o.steps > 0 && o.warmup >= 0, "models_train: --steps must be positive");
  if (o.batch == 0) o.batch = o.model == "cnn" ? 128 : 32;
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  set_num_threads(o.threads);
  manual_seed(0);
  const Device device = o.device == "cuda" ? Device::cuda(0) : Device::cpu();
  std::shared_ptr<nn::Module> model;
  std::function<Tensor(int)> loss_of;
  std::vector<Tensor> xs, ys;
  int64_t items = 0;
  if (o.model == "cnn") {
    model = fashion_cnn();
    for (int i = 0; i < 4; ++i) {
      xs.push_back(randn({o.batch, 1, 28, 28}).to(device));
      ys.push_back(randint(0, 10, {o.batch}).to(device));
    }
    loss_of = [&](int i) { return cross_entropy(model->forward(xs[size_t(i)]), ys[size_t(i)]); };
    items = o.batch;
  } else {
    nn::GPT2Config c;
    c.vocab_size = o.vocab;
    c.n_positions = o.seq;
    c.n_embd = o.n_embd;
    c.n_layer = o.n_layer;
    c.n_head = o.n_head;
    c.bos_token_id = c.eos_token_id = o.vocab - 1;
    auto gpt = std::make_shared<nn::GPT2LMHeadModel>(c);
    model = gpt;
    for (int i = 0; i < 4; ++i) xs.push_back(randint(0, o.vocab, {o.batch, o.seq}).to(device));
    loss_of = [&, gpt](int i) { return gpt->forward(xs[size_t(i)], Tensor(), xs[size_t(i)]).loss; };
    items = o.batch * o.seq;
  }
  model->to(device);
  model->train();
  optim::AdamW opt(model->parameters(), {.lr = o.model == "cnn" ? 1e-3 : 2e-3, .weight_decay = o.model == "cnn" ? 0.01 : 0.1});
  std::vector<double> ms;
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    Tensor loss;
    {
      std::optional<AutocastGuard> autocast;
      if (o.dtype == "bf16") autocast.emplace(device.type, DType::bf16);
      loss = loss_of(step % 4);
    }
    loss.backward();
    opt.step();
    last_loss = loss.item<double>();  // waits for the device, so the step is timed whole
    if (step == 0) first_loss = last_loss;
    const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step >= o.warmup) ms.push_back(elapsed);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  std::printf("{\"kind\": \"result\", \"model\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"batch\": %lld, "
              "\"median_step_ms\": %.3f, \"min_step_ms\": %.3f, \"items_per_s\": %.1f, \"first_loss\": %.4f, "
              "\"last_loss\": %.4f, \"params\": %lld}\n",
              o.model.c_str(), o.device.c_str(), o.dtype.c_str(), o.threads, (long long)o.batch, median, ms.front(),
              double(items) / (median / 1000.0), first_loss, last_loss, (long long)model->num_parameters());
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
