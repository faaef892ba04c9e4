// Trains a small MLP (2 -> 64 -> 64 -> 3) to tell three interleaved spirals apart, using
// only tensors, autograd and a momentum update written out by hand. Prints the loss as it
// falls (ten lines, and a progress bar on stderr), then the accuracy on the training points and on a freshly drawn sample; exits 0
// only when both exceed 90%.
//
//   mlp_spirals [--steps N] [--lr X] [--seed S] [--threads T]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ember/ember.h>

using ember::Tensor;

namespace {

constexpr int64_t kClasses = 3;
constexpr int64_t kPointsPerClass = 300;
constexpr int64_t kHidden = 64;
constexpr double kTurns = 1.0;       // how far each arm winds round the centre
constexpr double kAngleNoise = 0.2;  // radians; makes neighbouring arms overlap a little
constexpr double kMomentum = 0.9;
constexpr double kPassAccuracy = 0.9;
constexpr double kPi = 3.14159265358979323846;

struct Options {
  int64_t steps = 1500;
  double lr = 0.1;
  uint64_t seed = 0;
  int threads = 0;  // 0: keep the default
};

struct Dataset {
  Tensor points;  // [N, 2] f32
  Tensor labels;  // [N] i64
};

// Arm k: a point at radius r in [0, 1) sits at angle k*2pi/K + r*kTurns*2pi (plus Gaussian
// noise), so each arm winds kTurns times outwards. Radii and noise come from Ember's seeded
// generator.
Dataset make_spirals(int64_t per_class) {
  const int64_t n = per_class * kClasses;
  const std::vector<float> radius = ember::rand({n}).to_vector<float>();
  const std::vector<float> jitter = ember::randn({n}).to_vector<float>();
  std::vector<float> xy(size_t(2 * n));
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t arm = i / per_class;
    const double r = radius[size_t(i)];
    const double angle = 2.0 * kPi * (double(arm) / double(kClasses) + kTurns * r) + kAngleNoise * jitter[size_t(i)];
    xy[size_t(2 * i)] = float(r * std::sin(angle));
    xy[size_t(2 * i + 1)] = float(r * std::cos(angle));
    labels[size_t(i)] = arm;
  }
  return {ember::from_vector(xy, {n, 2}), ember::from_vector(labels, {n})};
}

struct Layer {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out]
};

// Uniform in [-1/sqrt(in), 1/sqrt(in)), as torch.nn.Linear initialises itself.
Layer make_layer(int64_t in, int64_t out) {
  const double bound = 1.0 / std::sqrt(double(in));
  Tensor w = (ember::rand({out, in}) * 2.0 - 1.0) * bound;
  Tensor b = (ember::rand({out}) * 2.0 - 1.0) * bound;
  return {w.requires_grad_(), b.requires_grad_()};
}

struct Mlp {
  Layer l1 = make_layer(2, kHidden);
  Layer l2 = make_layer(kHidden, kHidden);
  Layer l3 = make_layer(kHidden, kClasses);

  Tensor forward(const Tensor& x) const {
    Tensor h = ember::relu(ember::linear(x, l1.weight, l1.bias));
    h = ember::tanh(ember::linear(h, l2.weight, l2.bias));
    return ember::linear(h, l3.weight, l3.bias);  // logits [N, K]
  }
  std::vector<Tensor> parameters() const {
    return {l1.weight, l1.bias, l2.weight, l2.bias, l3.weight, l3.bias};
  }
};

double accuracy(const Mlp& model, const Dataset& data) {
  ember::NoGradGuard no_grad;
  Tensor predicted = ember::argmax(model.forward(data.points), 1);
  return ember::eq(predicted, data.labels).to(ember::DType::f32).mean().item<double>();
}

[[noreturn]] void usage(const char* prog, const std::string& problem) {
  std::fprintf(stderr, "%s: %s\nusage: %s [--steps N] [--lr X] [--seed S] [--threads T]\n", prog,
               problem.c_str(), prog);
  std::exit(2);
}

// Whole-string numbers only: "--steps 10x" is an error, not 10.
int64_t parse_int(const char* prog, const std::string& flag, const char* value) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0') usage(prog, "bad value '" + std::string(value) + "' for " + flag);
  return v;
}

double parse_double(const char* prog, const std::string& flag, const char* value) {
  char* end = nullptr;
  const double v = std::strtod(value, &end);
  if (end == value || *end != '\0') usage(prog, "bad value '" + std::string(value) + "' for " + flag);
  return v;
}

Options parse_options(int argc, char** argv) {
  Options opt;
  const char* prog = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage(prog, "trains an MLP on three spirals");
    if (i + 1 >= argc) usage(prog, "missing value after " + flag);
    const char* value = argv[++i];
    if (flag == "--steps") {
      opt.steps = parse_int(prog, flag, value);
      if (opt.steps < 1) usage(prog, "--steps must be at least 1");
    } else if (flag == "--lr") {
      opt.lr = parse_double(prog, flag, value);
      if (!(opt.lr > 0.0)) usage(prog, "--lr must be positive");
    } else if (flag == "--seed") {
      const int64_t seed = parse_int(prog, flag, value);
      if (seed < 0) usage(prog, "--seed must not be negative");
      opt.seed = uint64_t(seed);
    } else if (flag == "--threads") {
      const int64_t threads = parse_int(prog, flag, value);
      if (threads < 1 || threads > 4096) usage(prog, "--threads must be between 1 and 4096");
      opt.threads = int(threads);
    } else {
      usage(prog, "unknown option " + flag);
    }
  }
  return opt;
}

int run(const Options& opt) {
  if (opt.threads > 0) ember::set_num_threads(opt.threads);
  ember::manual_seed(opt.seed);
  const Dataset train = make_spirals(kPointsPerClass);
  const Dataset held_out = make_spirals(kPointsPerClass);  // later draws: different points
  Mlp model;
  const std::vector<Tensor> params = model.parameters();
  std::vector<Tensor> velocity;
  for (const Tensor& p : params) velocity.push_back(ember::zeros(p.shape()));

  std::printf("mlp_spirals: %lld points, %lld classes, %lld steps, lr %g, momentum %g, threads %d\n",
              (long long)train.labels.numel(), (long long)kClasses, (long long)opt.steps, opt.lr,
              kMomentum, ember::get_num_threads());
  const int64_t report_every = std::max<int64_t>(1, opt.steps / 10);
  ember::ProgressBar bar("train", opt.steps);
  for (int64_t step = 1; step <= opt.steps; ++step) {
    Tensor loss = ember::cross_entropy(model.forward(train.points), train.labels);
    loss.backward();
    {
      // v = momentum * v + grad;  p -= lr * v;  then drop the gradient for the next step
      ember::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor p = params[i];
        velocity[i].mul_(kMomentum).add_(p.grad());
        p.add_(velocity[i], -opt.lr);
        p.set_grad(Tensor());
      }
    }
    const double loss_value = loss.item<double>();
    char report[64];
    std::snprintf(report, sizeof report, "loss %.4f", loss_value);
    bar.update(step, report);
    if (step == 1 || step % report_every == 0 || step == opt.steps) {
      std::snprintf(report, sizeof report, "step %5lld  loss %.4f", (long long)step, loss_value);
      bar.print(report);
    }
  }
  bar.finish();
  const double seconds = bar.elapsed_seconds();

  const double train_acc = accuracy(model, train);
  const double held_out_acc = accuracy(model, held_out);
  std::printf("train accuracy %.1f%%, held-out accuracy %.1f%% (%.2f s of training)\n", 100.0 * train_acc,
              100.0 * held_out_acc, seconds);
  if (train_acc > kPassAccuracy && held_out_acc > kPassAccuracy) return 0;
  std::printf("FAILED: accuracy must exceed %.0f%% on both sets\n", 100.0 * kPassAccuracy);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse_options(argc, argv);
  try {
    return run(opt);
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "mlp_spirals: %s\n", e.what());
    return 1;
  }
}
