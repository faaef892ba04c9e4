// Loss scaling: the unscale kernel against the reference in every float dtype (inf, -inf and
// NaN detection included), GradScaler's scale/backoff/growth arithmetic, its misuse errors,
// its state dict, cross-rank agreement on overflows, and an f16-autocast MLP that starts with
// an overflowing scale, skips updates while the scale halves, then trains.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "core/autocast.h"
#include "core/native/amp.h"
#include "distributed/overflow_agreement.h"
#include "distributed/process_group.h"
#include "kernels/reference/amp.h"
#include "optim/grad_scaler.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// A 0-dim view of element `flat` (row-major) of t, whatever t's strides.
Tensor element(const Tensor& t, int64_t flat) {
  Tensor v = t;
  const Shape idx = reference::unravel(flat, t.shape());
  for (int64_t i : idx) v = v.select(0, i);
  return v;
}

struct UnscaleOutcome {
  Tensor grad;
  bool found_inf;
};

UnscaleOutcome run_unscale(Tensor grad, double inv_scale) {
  Tensor flag = zeros({1});
  native::amp_unscale_(grad, flag, inv_scale);
  return {grad, flag.item<double>() != 0.0};
}

}  // namespace

TEST(AmpUnscale, MatchesTheReferenceInEveryDtype) {
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const double specials[] = {kInf, -kInf, kNaN};
  for (DType dtype : ember::testing::kFloatTypes) {
    for (int trial = 0; trial < 24; ++trial) {
      const Shape shape = ember::testing::random_shape(int(ember::testing::uniform_int(0, 3)), 6, trial % 6 == 0);
      Tensor grad = random_tensor(shape, dtype, ember::testing::coin(), -100.0, 100.0);
      // A third clean, the rest with one or two non-finite values placed at random.
      const int bad = grad.numel() == 0 ? 0 : trial % 3;
      for (int k = 0; k < bad; ++k)
        element(grad, ember::testing::uniform_int(0, grad.numel() - 1)).fill_(specials[(trial + k) % 3]);
      const double inv_scale = trial % 2 ? std::ldexp(1.0, -int(ember::testing::uniform_int(0, 12))) : 1.0 / 3.0;
      const reference::UnscaleResult want = reference::amp_unscale(reference::from_tensor(grad), inv_scale, dtype);
      const UnscaleOutcome got = run_unscale(grad, inv_scale);
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << shape_str(shape) << " inv_scale " << inv_scale
                                        << " non-finite " << bad);
      EXPECT_TRUE(got.grad.is_same(grad));
      // f16 results below 2^-14 are subnormal: absolute spacing 2^-24.
      const double atol = dtype == DType::f16 ? 1e-7 : 0.0;
      EXPECT_TRUE(all_close(got.grad, want.grad, ember::testing::tolerance(dtype), atol));
      EXPECT_EQ(got.found_inf, want.found_inf);
      EXPECT_EQ(got.found_inf, bad > 0);
    }
  }
}

TEST(AmpUnscale, EachSpecialValueIsFoundAlone) {
  for (DType dtype : ember::testing::kFloatTypes)
    for (double special : {kInf, -kInf, kNaN}) {
      Tensor g = full({5}, 3.0, {dtype});
      element(g, 2).fill_(special);
      const UnscaleOutcome got = run_unscale(g, 0.5);
      EXPECT_TRUE(got.found_inf) << dtype_name(dtype) << " " << special;
      EXPECT_EQ(got.grad.to_vector<double>()[0], 1.5);
      EXPECT_EQ(got.grad.to_vector<double>()[4], 1.5);
    }
}

TEST(AmpUnscale, FindsANonFiniteValueInAnyThreadsShareOfALargeGradient) {
  // Long enough that parallel_for splits it; the bad value lands in a different chunk each time.
  const int64_t n = 300000;
  for (DType dtype : ember::testing::kFloatTypes)
    for (int64_t where : {int64_t(0), n / 2 + 7, n - 1}) {
      Tensor g = full({n}, 8.0, {dtype});
      element(g, where).fill_(where % 2 ? kNaN : -kInf);
      const UnscaleOutcome got = run_unscale(g, 0.25);
      EXPECT_TRUE(got.found_inf) << dtype_name(dtype) << " at " << where;
      const auto v = got.grad.to_vector<double>();
      EXPECT_EQ(v[size_t((where + 1) % n)], 2.0);
      Tensor clean = full({n}, 8.0, {dtype});
      EXPECT_FALSE(run_unscale(clean, 0.25).found_inf) << dtype_name(dtype);
    }
  auto [one, two] = ember::testing::with_one_and_two_threads([] {
    Tensor g = full({n}, 3.0);
    element(g, n - 2).fill_(kInf);
    Tensor flag = zeros({1});
    native::amp_unscale_(g, flag, 0.5);
    return flag;
  });
  EXPECT_EQ(one.item<double>(), 1.0);
  EXPECT_EQ(two.item<double>(), 1.0);
}

TEST(AmpUnscale, OverflowOnUnscalingCountsAndTheFlagIsSticky) {
  // A scale below 1 multiplies: 40000 * 2 does not fit in f16.
  Tensor g = from_vector<float>({40000.0f, 1.0f}).to(DType::f16);
  const auto want = reference::amp_unscale(reference::from_tensor(g), 2.0, DType::f16);
  EXPECT_TRUE(want.found_inf);
  EXPECT_TRUE(run_unscale(g, 2.0).found_inf);
  // In f32 the same values are fine.
  EXPECT_FALSE(run_unscale(from_vector<float>({40000.0f, 1.0f}), 2.0).found_inf);
  // The flag collects over several gradients and is never cleared.
  Tensor flag = zeros({1});
  native::amp_unscale_(from_vector<float>({float(kInf)}), flag, 1.0);
  native::amp_unscale_(from_vector<float>({1.0f}), flag, 1.0);
  EXPECT_EQ(flag.item<double>(), 1.0);
}

TEST(AmpUnscale, BadArgumentsAreErrors) {
  Tensor flag = zeros({1});
  EXPECT_EMBER_ERROR(native::amp_unscale_(from_vector<int64_t>({1}), flag, 1.0), "amp_unscale_", "floating-point",
                     "[1]");
  EXPECT_EMBER_ERROR(native::amp_unscale_(zeros({2}), zeros({2}), 1.0), "amp_unscale_", "found_inf", "[2]");
  EXPECT_EMBER_ERROR(native::amp_unscale_(zeros({2}), zeros({1}, {DType::f64}), 1.0), "found_inf", "float64");
  EXPECT_EMBER_ERROR(native::amp_unscale_(zeros({2}), flag, 0.0), "amp_unscale_", "inv_scale");
  EXPECT_EMBER_ERROR(native::amp_unscale_(zeros({2}), flag, kInf), "amp_unscale_", "inv_scale");
  EXPECT_EMBER_ERROR(native::amp_unscale_(zeros({1, 3}).expand({4, 3}), flag, 1.0), "amp_unscale_", "[4, 3]",
                     "overlapping");
  EXPECT_EMBER_ERROR(native::amp_unscale_(Tensor(), flag, 1.0), "amp_unscale_", "undefined");
}

// ---- GradScaler

namespace {

// One parameter whose gradient the test sets by hand; SGD with lr 1 makes p -= grad.
struct OneParam {
  Tensor p = from_vector<float>({1.0f, 2.0f}).requires_grad_();
  optim::SGD sgd{{p}, {.lr = 1.0}};
  void set_grad(std::vector<float> g) { p.set_grad(from_vector<float>(g)); }
  std::vector<float> value() const { return p.to_vector<float>(); }
};

}  // namespace

TEST(GradScaler, DefaultsAreTorchs) {
  optim::GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.5);
  EXPECT_EQ(scaler.get_growth_interval(), 2000);
  EXPECT_TRUE(scaler.is_enabled());
  EXPECT_EQ(scaler.growth_tracker(), 0);
  Tensor loss = from_vector<float>({0.5f});
  EXPECT_EQ(scaler.scale(loss).item<double>(), 32768.0);
  EXPECT_EQ(scaler.scale(loss).dtype(), DType::f32);
}

TEST(GradScaler, StepUnscalesAndSkipsNonFiniteGradients) {
  OneParam m;
  optim::GradScaler scaler({.init_scale = 1024.0});
  m.set_grad({2048.0f, -1024.0f});  // true gradient (2, -1)
  EXPECT_TRUE(scaler.step(m.sgd));
  EXPECT_EQ(m.value(), (std::vector<float>{-1.0f, 3.0f}));
  EXPECT_EQ(m.p.grad().to_vector<float>(), (std::vector<float>{2.0f, -1.0f}));  // unscaled in place
  scaler.update();

  // unscale_ first (e.g. for clipping): step must not divide a second time.
  m.set_grad({1024.0f, 1024.0f});
  scaler.unscale_(m.sgd);
  EXPECT_TRUE(scaler.is_unscaled(m.sgd));
  EXPECT_TRUE(scaler.awaiting_step());
  EXPECT_EQ(m.p.grad().to_vector<float>(), (std::vector<float>{1.0f, 1.0f}));
  EXPECT_TRUE(scaler.step(m.sgd));
  EXPECT_FALSE(scaler.awaiting_step());
  EXPECT_EQ(m.value(), (std::vector<float>{-2.0f, 2.0f}));
  scaler.update();
  EXPECT_FALSE(scaler.is_unscaled(m.sgd));

  for (double bad : {kInf, -kInf, kNaN}) {
    m.set_grad({1.0f, float(bad)});
    EXPECT_FALSE(scaler.step(m.sgd)) << bad;
    EXPECT_EQ(m.value(), (std::vector<float>{-2.0f, 2.0f})) << "a skipped step leaves the parameters";
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 1024.0 / 8.0);
}

TEST(GradScaler, BacksOffOnOverflowAndGrowsAfterTheIntervalOfCleanSteps) {
  OneParam m;
  optim::GradScaler scaler({.init_scale = 1024.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 3});
  auto iteration = [&](bool overflow) {
    m.set_grad({1.0f, overflow ? float(kInf) : 1.0f});
    const bool stepped = scaler.step(m.sgd);
    scaler.update();
    return stepped;
  };
  EXPECT_TRUE(iteration(false));
  EXPECT_TRUE(iteration(false));
  EXPECT_EQ(scaler.growth_tracker(), 2);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_TRUE(iteration(false));  // third clean step in a row: growth
  EXPECT_EQ(scaler.get_scale(), 4096.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_TRUE(iteration(false));
  EXPECT_TRUE(iteration(false));
  EXPECT_FALSE(iteration(true));  // overflow: backoff, and the count restarts
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_TRUE(iteration(false));
  EXPECT_TRUE(iteration(false));
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // two clean steps after the overflow: not yet
  EXPECT_TRUE(iteration(false));
  EXPECT_EQ(scaler.get_scale(), 4096.0);
  // update(new_scale) sets it outright.
  m.set_grad({1.0f, 1.0f});
  scaler.step(m.sgd);
  scaler.update(8.0);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EMBER_ERROR(scaler.update(-1.0), "update", "new_scale", "-1");
}

TEST(GradScaler, GrowthThatWouldOverflowFloat32IsDropped) {
  OneParam m;
  optim::GradScaler scaler({.init_scale = std::ldexp(1.0, 127), .growth_interval = 1});
  m.set_grad({1.0f, 1.0f});
  EXPECT_TRUE(scaler.step(m.sgd));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), std::ldexp(1.0, 127));
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, MisuseIsAnError) {
  OneParam m;
  optim::GradScaler scaler;
  m.set_grad({1.0f, 1.0f});
  scaler.unscale_(m.sgd);
  EXPECT_EMBER_ERROR(scaler.unscale_(m.sgd), "unscale_", "already been called", "since the last update()");
  scaler.step(m.sgd);
  EXPECT_EMBER_ERROR(scaler.unscale_(m.sgd), "unscale_", "after step()");
  EXPECT_EMBER_ERROR(scaler.step(m.sgd), "step", "already been called");
  scaler.update();
  EXPECT_EMBER_ERROR(scaler.update(), "update", "no optimizer", "step(optimizer)");
  // After update() the cycle starts over.
  m.set_grad({1.0f, 1.0f});
  scaler.unscale_(m.sgd);
  EXPECT_TRUE(scaler.step(m.sgd));
  scaler.update();

  EXPECT_EMBER_ERROR(optim::GradScaler({.init_scale = 0.0}), "init_scale", "positive");
  EXPECT_EMBER_ERROR(optim::GradScaler({.init_scale = 1e39}), "init_scale", "float32");
  EXPECT_EMBER_ERROR(optim::GradScaler({.growth_factor = 1.0}), "growth_factor", "> 1");
  EXPECT_EMBER_ERROR(optim::GradScaler({.backoff_factor = 1.0}), "backoff_factor", "(0, 1)");
  EXPECT_EMBER_ERROR(optim::GradScaler({.growth_interval = 0}), "growth_interval", ">= 1");
  EXPECT_EMBER_ERROR(scaler.scale(Tensor()), "scale", "undefined");
  EXPECT_EMBER_ERROR(scaler.scale(from_vector<int64_t>({1})), "scale", "floating-point");
}

TEST(GradScaler, DisabledIsTransparent) {
  OneParam m;
  optim::GradScaler scaler({.enabled = false});
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  Tensor loss = from_vector<float>({3.0f});
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  m.set_grad({1.0f, float(kInf)});
  scaler.unscale_(m.sgd);
  EXPECT_TRUE(scaler.step(m.sgd));  // no checks: the optimizer steps
  EXPECT_TRUE(std::isinf(m.value()[1]));
  scaler.update();
  scaler.update();
  EXPECT_TRUE(scaler.state_dict().empty());
}

TEST(GradScaler, StateDictRoundTrip) {
  OneParam m;
  optim::GradScaler scaler({.init_scale = 512.0, .growth_factor = 3.0, .backoff_factor = 0.25, .growth_interval = 5});
  for (bool overflow : {false, true, false, false}) {
    m.set_grad({1.0f, overflow ? float(kNaN) : 1.0f});
    scaler.step(m.sgd);
    scaler.update();
  }
  const auto sd = scaler.state_dict();
  EXPECT_EQ(sd.at("scale"), 128.0);
  EXPECT_EQ(sd.at("growth_tracker"), 2.0);
  EXPECT_EQ(sd.at("growth_factor"), 3.0);
  EXPECT_EQ(sd.at("backoff_factor"), 0.25);
  EXPECT_EQ(sd.at("growth_interval"), 5.0);

  optim::GradScaler restored;  // other options: the state brings its own
  restored.load_state_dict(sd);
  EXPECT_EQ(restored.state_dict(), sd);
  // Both continue alike: three more clean steps grow the scale by 3.
  for (optim::GradScaler* s : {&scaler, &restored}) {
    for (int i = 0; i < 3; ++i) {
      m.set_grad({1.0f, 1.0f});
      s->step(m.sgd);
      s->update();
    }
    EXPECT_EQ(s->get_scale(), 384.0);
  }

  EXPECT_EMBER_ERROR(restored.load_state_dict({}), "load_state_dict", "empty", "disabled");
  auto missing = sd;
  missing.erase("growth_tracker");
  EXPECT_EMBER_ERROR(restored.load_state_dict(missing), "load_state_dict", "'growth_tracker'");
  auto bad = sd;
  bad["backoff_factor"] = 2.0;
  EXPECT_EMBER_ERROR(restored.load_state_dict(bad), "load_state_dict", "backoff_factor");
  EXPECT_EQ(restored.get_scale(), 384.0);  // a refused state changes nothing
  optim::GradScaler disabled({.enabled = false});
  disabled.load_state_dict(sd);  // ignored, as in PyTorch
  EXPECT_EQ(disabled.get_scale(), 1.0);
}

namespace {

// Two "ranks" in one process: the peer's found-inf flag is whatever the test says, and the
// group reduces it with this rank's as a real one would.
class PeerFlagGroup : public distributed::ProcessGroup {
 public:
  explicit PeerFlagGroup(double peer_flag) : ProcessGroup(0, 2), peer_flag_(peer_flag) {}
  std::string backend_name() const override { return "fake"; }
  std::shared_ptr<distributed::Work> allreduce(Tensor t, distributed::ReduceOp op) override {
    ++calls;
    last_op = op;
    EXPECT_EQ(t.numel(), 1);
    EXPECT_TRUE(t.is_cpu());
    t.fill_(std::max(t.item<double>(), peer_flag_));
    return std::make_shared<Done>();
  }
  std::shared_ptr<distributed::Work> broadcast(Tensor, int) override { return std::make_shared<Done>(); }
  std::vector<Tensor> allgather(const Tensor& t) override { return {t, t}; }
  std::shared_ptr<distributed::Work> allgather_into(Tensor out, const Tensor& in) override {
    out.view({2, in.numel()}).copy_(in.reshape({1, in.numel()}));
    return std::make_shared<Done>();
  }
  std::shared_ptr<distributed::Work> reduce_scatter(Tensor, const Tensor&, distributed::ReduceOp) override {
    return std::make_shared<Done>();
  }
  void barrier() override {}
  std::vector<distributed::Bytes> allgather_bytes(const distributed::Bytes& mine) override { return {mine, mine}; }

  int calls = 0;
  distributed::ReduceOp last_op = distributed::ReduceOp::Sum;

 private:
  struct Done : distributed::Work {
    void wait() override {}
    bool is_completed() override { return true; }
  };
  double peer_flag_;
};

}  // namespace

TEST(GradScaler, AnOverflowOnAnotherRankSkipsTheStepHereToo) {
  OneParam m;
  PeerFlagGroup peer_overflowed(1.0);
  optim::GradScaler scaler({.init_scale = 4.0}, distributed::agree_on_overflow(&peer_overflowed));
  m.set_grad({4.0f, 4.0f});  // finite here
  EXPECT_FALSE(scaler.step(m.sgd));
  EXPECT_EQ(peer_overflowed.calls, 1);
  EXPECT_EQ(peer_overflowed.last_op, distributed::ReduceOp::Max);
  EXPECT_EQ(m.value(), (std::vector<float>{1.0f, 2.0f}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2.0);

  PeerFlagGroup peer_clean(0.0);
  optim::GradScaler agreeing({.init_scale = 4.0}, distributed::agree_on_overflow(&peer_clean));
  m.set_grad({4.0f, 4.0f});
  EXPECT_TRUE(agreeing.step(m.sgd));
  EXPECT_EQ(m.value(), (std::vector<float>{0.0f, 1.0f}));
  m.set_grad({1.0f, float(kInf)});  // the local overflow wins over a clean peer
  agreeing.update();
  EXPECT_FALSE(agreeing.step(m.sgd));
  EXPECT_EQ(peer_clean.calls, 2);
}

TEST(GradScaler, TheAgreementSeesTheLocalVerdictAndDecides) {
  OneParam m;
  std::vector<bool> seen;
  bool verdict = true;
  optim::GradScaler scaler({.init_scale = 4.0}, [&](bool found_inf_here, Device grads_device) {
    seen.push_back(found_inf_here);
    EXPECT_TRUE(grads_device.is_cpu());
    return verdict;
  });
  m.set_grad({4.0f, 4.0f});
  EXPECT_FALSE(scaler.step(m.sgd));  // clean here, overflowed elsewhere: skipped
  EXPECT_EQ(m.value(), (std::vector<float>{1.0f, 2.0f}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2.0);
  verdict = false;
  m.set_grad({1.0f, float(kInf)});
  EXPECT_TRUE(scaler.step(m.sgd));  // the agreement has the last word, as a collective would
  EXPECT_EQ(seen, (std::vector<bool>{false, true}));
  // A group of one needs no agreement.
  EXPECT_FALSE(bool(distributed::agree_on_overflow(nullptr)));
}

// ---- training under f16 autocast

namespace {

class TinyMlp : public nn::Module {
 public:
  TinyMlp() : Module("TinyMlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 1));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

std::vector<float> flat_params(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    auto v = p.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST(GradScaler, F16AutocastTrainingSkipsWhileTheScaleOverflowsThenRecovers) {
  manual_seed(11);
  TinyMlp model;
  optim::SGD sgd(model.parameters(), {.lr = 0.05});
  const Tensor x = randn({32, 4});
  const Tensor y = matmul(x, from_vector<float>({0.5f, -1.0f, 0.25f, 2.0f}, {4, 1})) + 0.3;
  optim::GradScaler scaler({.init_scale = std::ldexp(1.0, 40), .growth_interval = 1000});

  auto compute_loss = [&] {
    AutocastGuard ac(DeviceType::CPU, DType::f16);
    Tensor out = model.forward(x);
    EXPECT_EQ(out.dtype(), DType::f16);  // the linear layers ran in f16
    Tensor loss = nn::functional::mse_loss(out, y);
    EXPECT_EQ(loss.dtype(), DType::f32);  // losses in f32
    return loss;
  };

  int skipped = 0, taken_after_recovery = 0, iterations_after_recovery = 0;
  double first_clean_loss = -1, last_loss = -1;
  for (int it = 0; it < 120; ++it) {
    const std::vector<float> before = flat_params(model);
    const double scale_before = scaler.get_scale();
    Tensor loss = compute_loss();
    scaler.scale(loss).backward();
    for (const auto& p : model.parameters()) EXPECT_EQ(p.grad().dtype(), DType::f32);  // f32 parameters, f32 grads
    const bool stepped = scaler.step(sgd);
    scaler.update();
    sgd.zero_grad();
    last_loss = loss.item<double>();
    if (first_clean_loss < 0 && !stepped) {
      ++skipped;
      EXPECT_EQ(flat_params(model), before) << "iteration " << it << ": a skipped step changed the parameters";
      EXPECT_EQ(scaler.get_scale(), scale_before / 2) << "iteration " << it;
      continue;
    }
    if (first_clean_loss < 0) first_clean_loss = last_loss;
    ++iterations_after_recovery;
    if (stepped) {
      ++taken_after_recovery;
      EXPECT_NE(flat_params(model), before);
    }
  }
  // 2^40 times a gradient of order 1 overflows f16 (max 65504) for many halvings.
  EXPECT_GE(skipped, 10);
  EXPECT_LE(scaler.get_scale(), 65536.0);
  ASSERT_GT(first_clean_loss, 0) << "the scale never came down far enough to step";
  EXPECT_GE(taken_after_recovery, iterations_after_recovery * 9 / 10);
  EXPECT_LT(last_loss, 0.5 * first_clean_loss) << "training did not reduce the loss";
}

TEST(GradScaler, UnscaledGradientsEqualTheUnscaledBackward) {
  // Scaling by a power of two and unscaling again is exact unless something overflows or
  // underflows, so the gradients match those of the plain f16-autocast backward.
  manual_seed(12);
  TinyMlp model;
  optim::SGD sgd(model.parameters(), {.lr = 0.0});
  const Tensor x = randn({8, 4}), y = randn({8, 1});
  auto backward = [&](optim::GradScaler* scaler) {
    sgd.zero_grad();
    Tensor loss;
    {
      AutocastGuard ac(DeviceType::CPU, DType::f16);
      loss = nn::functional::mse_loss(model.forward(x), y);
    }
    (scaler ? scaler->scale(loss) : loss).backward();
    if (scaler) scaler->unscale_(sgd);
    std::vector<Tensor> grads;
    for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = backward(nullptr);
  optim::GradScaler scaler({.init_scale = 256.0});
  const auto unscaled = backward(&scaler);
  ASSERT_EQ(plain.size(), unscaled.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(all_close(unscaled[i], plain[i], 1e-3, 1e-6)) << i;
}
