// The BERT-mini and memory-cap checks of fsdp_worker (modes `bert` and `cap`).
//
// bert: BERT-mini shapes (4 layers, hidden 256, 4 heads, FFN 1024; a 512-token vocabulary so
//   the run stays short) trains 20 AdamW steps under each strategy, every step two micro-batches
//   (the first under no_sync) and a clip to the global norm, and must reach the weights of one
//   process on the N-times batch: at least 99.9% of the entries within 1e-6, the mean within
//   1e-7, every entry within 1e-4 (the kF32 bounds below say why not every entry within 1e-6).
//   The bf16 run: FULL_SHARD with param_dtype bf16 against one process under the same policy,
//   within kBf16MaxTolerance (kBf16MeanTolerance on average).
// cap: a 12-layer MLP (Ψ = 3.2 M) under a per-process cap of 12Ψ bytes, below the 16Ψ of replication: NO_SHARD must
//   fail with the allocator's out-of-memory error, FULL_SHARD must train and match the weights
//   one process reaches without a cap.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/grad_mode.h"
#include "core/rng.h"
#include "distributed/fsdp.h"
#include "distributed/hash_store.h"
#include "distributed/process_group_gloo.h"
#include "nn/functional.h"
#include "nn/layers/basic.h"
#include "nn/models/bert.h"
#include "optim/clip_grad.h"
#include "optim/sgd_adam.h"

namespace ember::fsdp_checks {

using distributed::FSDPOptions;
using distributed::ProcessGroup;
using distributed::ShardingStrategy;

inline nn::BertConfig mini_bert_config() {
  nn::BertConfig c = nn::BertConfig::mini(512);
  c.max_position_embeddings = 32;
  c.hidden_dropout_prob = 0.0;  // ranks would draw other masks than the one-process run
  c.attention_probs_dropout_prob = 0.0;
  return c;
}

// Rows [first, first + count) of the MLM batch of micro-batch `m` (of `global` rows, 24 tokens).
inline std::pair<Tensor, Tensor> mlm_rows(int m, int64_t global, int64_t first, int64_t count) {
  const int64_t len = 24, vocab = 512;
  std::vector<int64_t> ids, labels;
  for (int64_t r = first; r < first + count; ++r)
    for (int64_t t = 0; t < len; ++t) {
      const int64_t v = (m * 131 + r * 37 + t * 11) % vocab;
      ids.push_back(v);
      // Every row scores the same number of positions, so the per-rank means average exactly.
      labels.push_back(t % 4 == m % 4 ? (v * 7 + 3) % vocab : -100);
    }
  (void)global;
  return {from_vector<int64_t>(ids, {count, len}), from_vector<int64_t>(labels, {count, len})};
}

// Every entry by name, flattened into host memory (not the allocator's, so caps do not count it).
using HostValues = std::map<std::string, std::vector<float>>;
inline HostValues host_values(const std::vector<std::pair<std::string, Tensor>>& named) {
  HostValues out;
  for (const auto& [name, t] : named) out[name] = t.contiguous().to_vector<float>();
  return out;
}

// How far `got` is from `reference` over the reference's entries (the parameters; buffers a
// state dict adds beside them are not compared). A missing entry or a size mismatch makes every
// figure infinite.
struct Distance {
  double max = 0, mean = 0;
  double fraction_over_1e6 = 0;  // share of the entries more than 1e-6 away
};
inline Distance distance(const HostValues& got, const HostValues& reference) {
  double sum = 0, over = 0, n = 0, max = 0;
  for (const auto& [name, want] : reference) {
    auto it = got.find(name);
    if (it == got.end() || it->second.size() != want.size()) {
      std::printf("entry %s missing or resized\n", name.c_str());
      return {INFINITY, INFINITY, INFINITY};
    }
    for (size_t k = 0; k < want.size(); ++k) {
      const double d = std::abs(double(it->second[k]) - double(want[k]));
      max = std::max(max, d);
      sum += d;
      over += d > 1e-6 ? 1 : 0;
    }
    n += double(want.size());
  }
  return n > 0 ? Distance{max, sum / n, over / n} : Distance{};
}
inline double max_abs_diff(const HostValues& got, const HostValues& reference) {
  return distance(got, reference).max;
}

constexpr int kBertSteps = 20, kMicro = 2;
constexpr int64_t kRowsPerRank = 2;
constexpr double kClip = 1.0;
constexpr optim::AdamWOptions kBertAdamW{.lr = 1e-3, .weight_decay = 0.01};

// The bf16 run's bounds. AdamW moves an element by at most about lr a step, and bf16 rounding of
// a near-zero gradient can flip its sign on one side only, so over 20 steps an element may drift
// up to 20 lr = 2e-2 (measured 0.008-0.011 at 2-4 ranks); the mean must stay far below that
// (measured 3e-5, half the 6e-5 that separates one bf16 process from one f32 process).
constexpr double kBf16MaxTolerance = 20 * 1e-3, kBf16MeanTolerance = 1e-4;

// The f32 bounds. All but a few hundred of the 3.4 M entries land within 1e-6 of one process
// (measured 0.005-0.023% beyond it at 2-4 ranks, mean 3e-9 to 3e-8); those few are the elements
// whose gradient cancels to rounding noise, first among them the attention key biases (softmax
// ignores them, so their exact gradient is zero), where AdamW's division by the root of the second
// moment turns a last-bit difference into a step of up to lr (max measured 3.4e-5).
constexpr double kF32FractionOver1e6 = 1e-3, kF32MeanTolerance = 1e-7, kF32MaxTolerance = 1e-4;

// One process on the whole batch: the weights every f32 strategy must reach.
inline HostValues bert_reference(int world) {
  manual_seed(11);
  nn::BertForMaskedLM model(mini_bert_config());
  optim::AdamW opt(model.parameters(), kBertAdamW);
  for (int s = 0; s < kBertSteps; ++s) {
    for (int m = 0; m < kMicro; ++m) {
      auto [ids, labels] = mlm_rows(s * kMicro + m, kRowsPerRank * world, 0, kRowsPerRank * world);
      (model.forward(ids, Tensor(), Tensor(), labels).loss * (1.0 / kMicro)).backward();
    }
    optim::clip_grad_norm_(model.parameters(), kClip);
    opt.step();
    opt.zero_grad();
  }
  return host_values(model.named_parameters());
}

// Trains BERT-mini sharded over `pg` on rows [first, first + count) of every micro-batch of
// `global` rows. With `param_dtype`, FULL_SHARD gathers a copy in it and the forward runs under
// its autocast (as the Accelerator's mixed_precision does).
inline HostValues train_bert_sharded(const std::shared_ptr<ProcessGroup>& pg, ShardingStrategy s,
                                     std::optional<DType> param_dtype, int64_t global, int64_t first, int64_t count) {
  manual_seed(11);
  auto model = std::make_shared<nn::BertForMaskedLM>(mini_bert_config());
  FSDPOptions o;
  o.sharding_strategy = s;
  o.transformer_layer_cls_to_wrap = {"BertLayer"};
  o.mixed_precision.param_dtype = param_dtype;
  auto fsdp = distributed::shard_model(model, pg, o);
  optim::AdamW opt(fsdp->parameters(), kBertAdamW);
  for (int step = 0; step < kBertSteps; ++step) {
    for (int m = 0; m < kMicro; ++m) {
      auto [ids, labels] = mlm_rows(step * kMicro + m, global, first, count);
      Tensor loss;
      {
        std::optional<AutocastGuard> amp;
        if (param_dtype) amp.emplace(DeviceType::CPU, *param_dtype);
        loss = model->forward(ids, Tensor(), Tensor(), labels).loss * (1.0 / kMicro);
      }
      if (m + 1 < kMicro) {
        auto guard = fsdp->no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    fsdp->clip_grad_norm_(kClip);
    opt.step();
    opt.zero_grad();
  }
  return host_values(fsdp->full_state_dict());
}

// One process on the whole batch under the same bf16/f16 policy: its own one-rank group, since
// an f32 model under autocast keeps f32 embeddings and norms where the policy rounds them.
inline HostValues bert_policy_reference(int world, DType param_dtype) {
  auto alone = std::make_shared<distributed::ProcessGroupGloo>(std::make_shared<distributed::HashStore>(), 0, 1);
  return train_bert_sharded(alone, ShardingStrategy::FULL_SHARD, param_dtype, kRowsPerRank * world, 0,
                            kRowsPerRank * world);
}

// `reference`: bert_reference(world) without param_dtype, else bert_policy_reference.
inline bool check_bert(const std::shared_ptr<ProcessGroup>& pg, ShardingStrategy s, const HostValues& reference,
                       std::optional<DType> param_dtype = std::nullopt) {
  const int world = pg->size(), rank = pg->rank();
  const HostValues got = train_bert_sharded(pg, s, param_dtype, kRowsPerRank * world, kRowsPerRank * rank, kRowsPerRank);
  const Distance d = distance(got, reference);
  const bool ok = param_dtype ? d.max <= kBf16MaxTolerance && d.mean <= kBf16MeanTolerance
                              : d.fraction_over_1e6 <= kF32FractionOver1e6 && d.mean <= kF32MeanTolerance &&
                                    d.max <= kF32MaxTolerance;
  const std::string name = std::string(distributed::sharding_strategy_name(s)) +
                           (param_dtype ? std::string(" param_dtype ") + dtype_name(*param_dtype) : "");
  std::printf("rank %d BERT-mini %s, %d ranks, %d steps: max abs diff %.3g, mean %.3g, %.4f%% over 1e-6\n", rank,
              name.c_str(), world, kBertSteps, d.max, d.mean, 100 * d.fraction_over_1e6);
  if (ok) std::printf("%s bert ok\n", name.c_str());
  return ok;
}

// Twelve 512x512 layers: big enough that 16 bytes per parameter is megabytes, small enough to
// train a few steps in well under a second.
class DeepMlp : public nn::Module {
 public:
  DeepMlp() : Module("DeepMlp") {
    for (int i = 0; i < 12; ++i)
      layers.push_back(register_module("l" + std::to_string(i), std::make_shared<nn::Linear>(512, 512)));
  }
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    Tensor h = x;
    for (auto& l : layers) h = tanh(l->forward(h));
    return scope.exit(h);
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};

inline std::pair<Tensor, Tensor> regression_rows(int step, int64_t first, int64_t count) {
  manual_seed(uint64_t(1000 + step));
  Tensor x = randn({64, 512}), y = randn({64, 512});
  return {x.narrow(0, first, count).contiguous(), y.narrow(0, first, count).contiguous()};
}

// Trains 3 steps of DeepMlp; the world's rows of each 64-row batch are split across the ranks.
inline void train_deep_mlp(DeepMlp& model, optim::Optimizer& opt, int world, int rank,
                           distributed::FullyShardedDataParallel* fsdp) {
  const int64_t rows = 64 / world;
  for (int s = 0; s < 3; ++s) {
    if (fsdp) fsdp->sync_parameters();
    auto [x, y] = regression_rows(s, rows * rank, rows);
    nn::functional::mse_loss(model.forward(x), y).backward();
    opt.step();
    opt.zero_grad();
  }
}

inline std::shared_ptr<DeepMlp> make_deep_mlp() {
  manual_seed(21);
  return std::make_shared<DeepMlp>();
}

// A fresh DeepMlp, each Linear its own unit, trained 3 steps under strategy `s`.
inline std::shared_ptr<distributed::FullyShardedDataParallel> train_sharded_deep_mlp(
    const std::shared_ptr<ProcessGroup>& pg, ShardingStrategy s, const optim::AdamWOptions& adamw) {
  auto model = make_deep_mlp();
  FSDPOptions o;
  o.sharding_strategy = s;
  o.transformer_layer_cls_to_wrap = {"Linear"};
  auto fsdp = distributed::shard_model(model, pg, o);
  optim::AdamW opt(fsdp->parameters(), adamw);
  train_deep_mlp(*model, opt, pg->size(), pg->rank(), fsdp.get());
  return fsdp;
}

inline bool check_memory_cap(const std::shared_ptr<ProcessGroup>& pg) {
  const int rank = pg->rank();
  const optim::AdamWOptions adamw{.lr = 1e-3};
  HostValues reference;
  int64_t psi = 0;
  {
    auto model = make_deep_mlp();
    psi = model->num_parameters();
    optim::AdamW opt(model->parameters(), adamw);
    train_deep_mlp(*model, opt, 1, 0, nullptr);
    reference = host_values(model->named_parameters());
  }
  CpuCachingAllocator& alloc = cpu_allocator();
  alloc.empty_cache();
  const int64_t cap = 12 * psi;  // three quarters of the 16 bytes per parameter replication keeps
  bool ok = true;

  alloc.set_memory_limit(cap);
  std::string replicated_error;
  try {
    train_sharded_deep_mlp(pg, ShardingStrategy::NO_SHARD, adamw);
  } catch (const Error& e) {
    replicated_error = e.what();
  }
  alloc.set_memory_limit(0);
  // The failing rank's peers may still be inside a collective: meet again before going on.
  pg->barrier();
  std::printf("rank %d NO_SHARD under a cap of %lld bytes (Ψ = %lld): %s\n", rank, (long long)cap,
              (long long)psi, replicated_error.empty() ? "trained" : replicated_error.c_str());
  ok = ok && replicated_error.find("out of memory") != std::string::npos;

  alloc.empty_cache();
  alloc.set_memory_limit(cap);
  alloc.reset_peak();
  double diff = INFINITY;
  try {
    auto fsdp = train_sharded_deep_mlp(pg, ShardingStrategy::FULL_SHARD, adamw);
    alloc.set_memory_limit(0);  // the full copy below is for the comparison only
    diff = max_abs_diff(host_values(fsdp->full_state_dict()), reference);
  } catch (const Error& e) {
    std::printf("rank %d FULL_SHARD under the cap failed: %s\n", rank, e.what());
  }
  alloc.set_memory_limit(0);
  std::printf("rank %d FULL_SHARD under the cap: peak %lld bytes of %lld, max abs diff %.3g\n", rank,
              (long long)alloc.stats().peak_bytes_in_use, (long long)cap, diff);
  ok = ok && diff <= 1e-5;
  if (ok) std::printf("memory cap ok\n");
  return ok;
}

}  // namespace ember::fsdp_checks
