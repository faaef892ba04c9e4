// The Accelerator and the NCCL pieces under it on a GPU machine, in one process: prepare()
// moves the model to cuda:0 and hands out batches on cuda:0, bf16 mixed precision trains a
// tiny BERT, the NCCL process group of world size 1 runs its collectives correctly (including
// views with a storage offset and data a kernel has just queued), and DDP over that group
// gives the gradients of plain training. Every test skips without a CUDA device.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "accelerate/accelerator.h"
#include "bert_golden_support.h"
#include "core/device_api.h"
#include "distributed/ddp.h"
#include "distributed/hash_store.h"
#include "nn/functional.h"
#include "nn/models/bert.h"
#include "optim/sgd_adam.h"
#include "test_util.h"
#if defined(EMBER_WITH_NCCL)
#include "distributed/nccl/process_group_nccl.h"
#endif

using namespace ember;
using namespace ember::distributed;
using ember::testing::random_index;
using ember::testing::random_tensor;
using ember::testing::uniform_int;
using ember::testing::bert_golden::close_to_golden;

namespace {

const Device kGpu = Device::cuda(0);

class Mlp : public nn::Module {
 public:
  Mlp(int64_t in, int64_t hidden, int64_t out) : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(in, hidden));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{hidden}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, hidden));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(hidden, out));
  }
  Tensor forward(const Tensor& x) override {
    return fc3->forward(relu(fc2->forward(norm->forward(gelu(fc1->forward(x))))));
  }
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
  std::shared_ptr<nn::LayerNorm> norm;
};

// Bitwise equality of two tensors' values (any devices).
::testing::AssertionResult same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i])) return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs " << y[i];
  return ::testing::AssertionSuccess();
}

// A masked-LM data set: n examples of length len, padded after a random length, every real
// token but the first scored.
std::shared_ptr<data::TensorDataset> mlm_dataset(int64_t n, int64_t len, int64_t vocab) {
  std::vector<int64_t> ids(size_t(n * len), 0), mask(ids.size(), 0), types(ids.size(), 0), labels(ids.size(), -100);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t real = uniform_int(len / 2, len);
    for (int64_t i = 0; i < real; ++i) {
      const size_t k = size_t(b * len + i);
      // Position-typical tokens, so that there is something to learn in a few steps.
      ids[k] = 4 + (uniform_int(0, 4) == 0 ? uniform_int(0, vocab - 5) : (7 * i + 3) % (vocab - 4));
      mask[k] = 1;
      types[k] = i >= real / 2 ? 1 : 0;
      if (i > 0) labels[k] = ids[k];
    }
  }
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{
      {"input_ids", from_vector(ids, {n, len})},
      {"attention_mask", from_vector(mask, {n, len})},
      {"token_type_ids", from_vector(types, {n, len})},
      {"labels", from_vector(labels, {n, len})}});
}

nn::BertConfig tiny_config(int64_t vocab, int64_t len) {
  nn::BertConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = len;
  c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  c.validate();
  return c;
}

}  // namespace

TEST(CudaAccelerator, PrepareMovesTheModelAndTheBatchesToTheGpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Accelerator acc;
  EXPECT_EQ(acc.device(), kGpu);
  EXPECT_EQ(acc.num_processes(), 1);
  EXPECT_EQ(acc.distributed_type(), "NO");
  EXPECT_EQ(acc.process_group(), nullptr);
  manual_seed(uint64_t(uniform_int(0, 1000000)));
  const int64_t n = uniform_int(9, 30), in = 7, out = 3;
  auto model = std::make_shared<Mlp>(in, 24, out);
  // The optimizer is made before prepare(), as in Accelerate: it sees the moved parameters.
  optim::AdamW opt(model->parameters(), {.lr = 1e-2});
  const Tensor x = random_tensor({n, in}), y = random_tensor({n, out});
  data::DataLoader loader(std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", x}, {"y", y}}),
                          {.batch_size = 4});
  auto [m, o, l] = acc.prepare(model, opt, loader);
  EXPECT_EQ(m, model);
  for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.device(), kGpu) << name;
  EXPECT_EQ(l->device(), kGpu);
  std::vector<float> xs;
  nn::StateDict before;
  for (const auto& [name, p] : model->named_parameters()) before[name] = p.clone();
  for (auto& batch : *l) {
    ASSERT_EQ(batch.at("x").device(), kGpu);
    ASSERT_EQ(batch.at("y").device(), kGpu);
    const auto bx = batch.at("x").to_vector<float>();
    xs.insert(xs.end(), bx.begin(), bx.end());
    const Tensor loss = nn::functional::mse_loss(m->forward(batch.at("x")), batch.at("y"));
    EXPECT_EQ(loss.device(), kGpu);
    acc.backward(loss);
    for (const auto& [name, p] : model->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().device(), kGpu) << name;
    }
    o->step();
    o->zero_grad();
  }
  EXPECT_EQ(xs, x.to_vector<float>()) << "every row once, in order";
  EXPECT_EQ(o->num_updates(), (n + 3) / 4);
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(p.device(), kGpu) << name;
    EXPECT_FALSE(close_to_golden(name, p, before.at(name), 1e-4)) << name << " did not move";
  }
}

TEST(CudaAccelerator, Bf16MixedPrecisionTrainsATinyBert) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  constexpr int64_t kVocab = 40, kLen = 16, kExamples = 8, kSteps = 10;
  Accelerator acc({.mixed_precision = "bf16"});
  EXPECT_EQ(acc.scaler(), nullptr);
  manual_seed(uint64_t(uniform_int(0, 1000000)));
  auto model = std::make_shared<nn::BertForMaskedLM>(tiny_config(kVocab, kLen));
  optim::AdamW opt(model->parameters(), {.lr = 5e-3});
  data::DataLoader loader(mlm_dataset(kExamples, kLen, kVocab), {.batch_size = kExamples});
  auto [m, o, l] = acc.prepare(model, opt, loader);
  EXPECT_TRUE(m->converts_outputs_to_f32());
  std::vector<double> losses;
  for (int64_t epoch = 0; epoch < kSteps; ++epoch) {
    l->set_epoch(epoch);
    for (auto& batch : *l) {
      EXPECT_EQ(batch.at("input_ids").device(), kGpu);
      nn::ModelOutput out;
      {
        auto ac = acc.autocast();
        EXPECT_TRUE(autocast_enabled(DeviceType::CUDA));
        EXPECT_EQ(autocast_dtype(DeviceType::CUDA), DType::bf16);
        out = m->forward(batch);
      }
      EXPECT_FALSE(autocast_enabled(DeviceType::CUDA));
      EXPECT_EQ(out.logits.dtype(), DType::f32) << "convert_outputs_to_fp32";
      EXPECT_EQ(out.loss.dtype(), DType::f32);
      EXPECT_EQ(out.loss.device(), kGpu);
      losses.push_back(out.loss.item<double>());
      acc.backward(out.loss);
      o->step();
      o->zero_grad();
    }
  }
  ASSERT_EQ(int64_t(losses.size()), kSteps);
  for (double v : losses) EXPECT_TRUE(std::isfinite(v));
  // From about ln 40 = 3.7; ten steps on the same batch at lr 5e-3 take a good bite out of it.
  EXPECT_GT(losses.front(), 3.0);
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
  EXPECT_LT(losses.back(), losses[kSteps / 2]);
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::f32) << name;
    EXPECT_EQ(p.device(), kGpu) << name;
  }
}

#if defined(EMBER_WITH_NCCL)

namespace {

std::shared_ptr<ProcessGroup> nccl_world_of_one() {
  auto store = std::make_shared<HashStore>(std::chrono::milliseconds(20000));
  ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  opt.cuda_device = 0;
  return std::make_shared<ProcessGroupNCCL>(store, 0, 1, opt);
}

}  // namespace

TEST(CudaAccelerator, NcclGroupOfOneAllReducesCorrectly) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  auto pg = nccl_world_of_one();
  EXPECT_EQ(pg->backend_name(), "nccl");
  EXPECT_EQ(pg->size(), 1);
  EXPECT_EQ(pg->rank(), 0);
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const bool is_float = dt != DType::i32 && dt != DType::i64;
    const Tensor host = is_float ? random_tensor({uniform_int(1, 5000)}, dt)
                                 : random_index({uniform_int(1, 5000)}, 1000000, dt);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
      if (op == ReduceOp::Avg && !is_float) continue;
      Tensor t = host.to(kGpu);
      pg->allreduce(t, op)->wait();
      EXPECT_TRUE(same_values(t, host)) << "op " << int(op);
    }
  }
  // A view with a storage offset: only its own elements take part, in place.
  const int64_t rows = uniform_int(4, 20), cols = uniform_int(1, 33), r0 = uniform_int(1, rows - 2);
  const Tensor base_host = random_tensor({rows, cols});
  Tensor base = base_host.to(kGpu);
  Tensor view = base.narrow(0, r0, 2);
  pg->allreduce(view, ReduceOp::Sum)->wait();
  EXPECT_TRUE(same_values(base, base_host));
  const auto gathered = pg->allgather(view);
  ASSERT_EQ(gathered.size(), 1u);
  EXPECT_TRUE(same_values(gathered[0], base_host.narrow(0, r0, 2)));
  Tensor scattered = zeros({2, cols}, {DType::f32, kGpu});
  pg->reduce_scatter(scattered, view)->wait();
  EXPECT_TRUE(same_values(scattered, base_host.narrow(0, r0, 2)));
  // Data a kernel has just queued on the current stream: the collective waits for it.
  const int64_t n = int64_t(1) << 24;
  const Tensor big_host = random_tensor({n});
  const Tensor doubled = mul(big_host.to(kGpu), 2.0);
  const auto parts = pg->allgather(doubled);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_TRUE(same_values(parts[0], mul(big_host, 2.0)));
  Tensor summed = mul(big_host.to(kGpu), 3.0);
  pg->allreduce(summed, ReduceOp::Sum)->wait();
  EXPECT_TRUE(same_values(summed, mul(big_host, 3.0)));
}

TEST(CudaAccelerator, DdpOverNcclGivesTheGradientsOfPlainTraining) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  auto pg = nccl_world_of_one();
  for (bool bucket_view : {false, true}) {
    SCOPED_TRACE(bucket_view ? "gradient_as_bucket_view" : "copied gradients");
    manual_seed(uint64_t(uniform_int(0, 1000000)));
    const int64_t in = uniform_int(3, 40), hidden = uniform_int(16, 200), out = 5;
    auto plain = std::make_shared<Mlp>(in, hidden, out);
    auto wrapped = std::make_shared<Mlp>(in, hidden, out);
    wrapped->load_state_dict(plain->state_dict());
    plain->to(kGpu);
    wrapped->to(kGpu);
    // Buckets of about 4 KiB: the model's gradients travel in several of them.
    DistributedDataParallel ddp(wrapped, pg,
                                {.bucket_cap_mb = 4096.0 / (1024.0 * 1024.0), .gradient_as_bucket_view = bucket_view});
    optim::SGD sgd_plain(plain->parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::SGD sgd_wrapped(wrapped->parameters(), {.lr = 0.05, .momentum = 0.9});
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const int64_t batch = uniform_int(2, 17);
      const Tensor x = random_tensor({batch, in}).to(kGpu);
      const Tensor target = random_index({batch}, out).to(kGpu);
      const Tensor lp = cross_entropy(plain->forward(x), target);
      const Tensor lw = cross_entropy(ddp.forward(x), target);
      EXPECT_TRUE(same_values(lw, lp));
      lp.backward();
      lw.backward();
      const auto a = plain->named_parameters(), b = wrapped->named_parameters();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(b[i].second.grad().defined()) << b[i].first;
        EXPECT_EQ(b[i].second.grad().device(), kGpu) << b[i].first;
        // One rank: the average over ranks is the gradient itself.
        EXPECT_TRUE(close_to_golden("grad " + a[i].first, b[i].second.grad(), a[i].second.grad(), 1e-6));
      }
      sgd_plain.step();
      sgd_wrapped.step();
      sgd_plain.zero_grad();
      sgd_wrapped.zero_grad();
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(close_to_golden("after SGD " + a[i].first, b[i].second, a[i].second, 1e-6));
    }
  }
}

#endif
