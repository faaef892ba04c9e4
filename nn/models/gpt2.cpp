#include "nn/models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autograd/checkpoint.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "nn/init.h"
#include "nn/io/safetensors.h"
#include "nn/models/base_prefix.h"

namespace ember::nn {

namespace {

// transformers' eager GPT-2 mask in additive form, [B, 1, L, L] in f32: the lowest float where
// key j > query i, plus the lowest float where key j is padding (the two add up to -inf, as in
// transformers, so a row whose every visible key is padding still matches it).
// The additive mask of L new tokens after T cached ones, [L, T + L] or, with attention_mask
// [B, T + L], [B, 1, L, T + L]: key j is hidden from query i (position T + i) when j > T + i or
// when attention_mask[b, j] is 0.
Tensor additive_attention_mask(const Tensor& attention_mask, int64_t cached, int64_t len, Device device) {
  const double lowest = -double(std::numeric_limits<float>::max());
  const TensorOptions i64{DType::i64, device};
  const int64_t total = cached + len;
  const Tensor rows = arange(double(cached), double(total), 1, i64).view({len, 1});
  const Tensor cols = arange(0, double(total), 1, i64).view({1, total});
  const Tensor causal = masked_fill(zeros({len, total}, {DType::f32, device}), gt(cols, rows), lowest);
  if (!attention_mask.defined()) return causal;
  const Tensor keep = attention_mask.to(DType::f32).to(device).view({attention_mask.size(0), 1, 1, total});
  return causal + (1.0 - keep) * lowest;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

JsonConfig GPT2PretrainedModel::config_json() const {
  return JsonConfig::parse(config.to_json_string(), "config.json");
}

void GPT2PretrainedModel::gradient_checkpointing_enable() { gpt2_model().gradient_checkpointing = true; }
void GPT2PretrainedModel::gradient_checkpointing_disable() { gpt2_model().gradient_checkpointing = false; }
bool GPT2PretrainedModel::is_gradient_checkpointing() const { return gpt2_model().gradient_checkpointing; }

void init_gpt2_weights(Module& root, const GPT2Config& c) {
  NoGradGuard ng;
  const double range = c.initializer_range;
  for (auto& [name, m] : root.named_modules()) {
    if (auto* conv = dynamic_cast<Conv1D*>(m)) {
      const bool residual = ends_with(name, "c_proj");
      init::normal_(conv->weight, 0.0, residual ? range / std::sqrt(2.0 * double(c.n_layer)) : range);
      init::zeros_(conv->bias);
    } else if (auto* emb = dynamic_cast<Embedding*>(m)) {
      init::normal_(emb->weight, 0.0, range);
    } else if (auto* ln = dynamic_cast<LayerNorm*>(m)) {
      init::ones_(ln->weight);
      init::zeros_(ln->bias);
    } else if (auto* head = dynamic_cast<GPT2LMHead*>(m); head && !c.tie_word_embeddings) {
      init::normal_(head->weight, 0.0, range);
    }
  }
}

GPT2Model::GPT2Model(const GPT2Config& c) : GPT2PretrainedModel("GPT2Model", c) {
  c.validate();
  wte = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd));
  wte->row_sparse_backward = true;  // the rows a batch read, not a vocabulary-sized table (as BERT's)
  wpe = register_module("wpe", std::make_shared<Embedding>(c.n_positions, c.n_embd));
  drop = register_module("drop", std::make_shared<Dropout>(c.embd_pdrop));
  h = register_module("h", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(std::make_shared<GPT2Block>(c, i));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(Shape{c.n_embd}, c.layer_norm_epsilon));
  init_gpt2_weights(*this, c);
}

Tensor GPT2Model::forward(const Tensor& input_ids, const Tensor& attention_mask, GPT2KVCache* cache) {
  auto scope = enter_forward();
  EMBER_CHECK(input_ids.dim() == 2, "GPT2Model: input_ids must be [batch, length], got shape ", input_ids.shape());
  const int64_t batch = input_ids.size(0), len = input_ids.size(1), cached = cache ? cache->length() : 0;
  EMBER_CHECK(cached + len <= config.n_positions, "GPT2Model: input_ids of shape ", input_ids.shape(),
              cached ? " after " + std::to_string(cached) + " cached tokens" : std::string(), " are longer than ",
              "n_positions = ", config.n_positions);
  if (cache) {
    EMBER_CHECK(cached == 0 || cache->layers[0].keys.size(0) == batch, "GPT2Model: input_ids of shape ",
                input_ids.shape(), " do not match the cache's batch of ", cache->layers[0].keys.size(0));
    cache->layers.resize(size_t(config.n_layer));
  }
  Tensor mask;
  if (attention_mask.defined()) {
    EMBER_CHECK(attention_mask.dim() == 2 && attention_mask.size(0) == batch && attention_mask.size(1) == cached + len,
                "GPT2Model: attention_mask ", attention_mask.shape(), " does not match input_ids ", input_ids.shape(),
                cached ? " after " + std::to_string(cached) + " cached tokens" : std::string());
    mask = additive_attention_mask(attention_mask, cached, len, input_ids.device());
  } else if (cached > 0 && len > 1) {
    mask = additive_attention_mask(Tensor(), cached, len, input_ids.device());  // causal past the cache
  }
  const Tensor positions = arange(double(cached), double(cached + len), 1, {DType::i64, input_ids.device()});
  Tensor x = drop->forward(wte->forward(input_ids) + wpe->forward(positions));
  const bool checkpointed = gradient_checkpointing && !cache && is_training() && GradMode::is_enabled();
  for (size_t i = 0; i < h->size(); ++i) {
    std::shared_ptr<GPT2Block> block = std::static_pointer_cast<GPT2Block>((*h)[i]);
    if (checkpointed) {
      // By value: backward calls this again after forward has returned.
      x = checkpoint([block, mask](const Tensor& in) { return block->forward(in, mask); }, x);
    } else {
      x = block->forward(x, mask, cache ? &cache->layers[i] : nullptr);
    }
  }
  return scope.exit(ln_f->forward(x));
}

Tensor GPT2LMHead::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(linear(x, weight));
}

GPT2LMHeadModel::GPT2LMHeadModel(const GPT2Config& c) : GPT2PretrainedModel("GPT2LMHeadModel", c) {
  transformer = register_module("transformer", std::make_shared<GPT2Model>(c));
  const Tensor head_weight = c.tie_word_embeddings ? transformer->wte->weight : zeros({c.vocab_size, c.n_embd});
  lm_head = register_module("lm_head", std::make_shared<GPT2LMHead>(head_weight));
  if (!c.tie_word_embeddings) init_gpt2_weights(*lm_head, c);
}

CausalLMOutput GPT2LMHeadModel::forward(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& labels,
                                        GPT2KVCache* cache) {
  auto scope = enter_forward();
  const Tensor logits = model_output(lm_head->forward(transformer->forward(input_ids, attention_mask, cache)));
  CausalLMOutput out{Tensor(), logits};
  if (labels.defined()) {
    EMBER_CHECK(labels.shape() == input_ids.shape(), "GPT2LMHeadModel: labels ", labels.shape(),
                " do not match input_ids ", input_ids.shape());
    const int64_t len = input_ids.size(1);
    // position t predicts token t + 1
    const Tensor shifted_logits = logits.narrow(1, 0, len - 1).reshape({-1, config.vocab_size});
    const Tensor shifted_labels = labels.narrow(1, 1, len - 1).reshape({-1}).to(DType::i64);
    out.loss = cross_entropy(shifted_logits, shifted_labels, -100);
  }
  return scope.exit(std::move(out), &CausalLMOutput::loss, &CausalLMOutput::logits);
}

namespace {

// A token drawn from the float logits of one row (temperature and top-k as in GenerateOptions),
// with one uniform number from `gen`.
int64_t sample_token(std::vector<float> logits, const GenerateOptions& o, Generator& gen) {
  const auto best = std::max_element(logits.begin(), logits.end());
  if (o.temperature <= 0.0) return int64_t(best - logits.begin());
  float threshold = -std::numeric_limits<float>::infinity();
  if (o.top_k > 0 && o.top_k < int64_t(logits.size())) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
    threshold = sorted[size_t(o.top_k - 1)];
  }
  std::vector<double> weights(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] < threshold) continue;
    weights[i] = std::exp((double(logits[i]) - double(*best)) / o.temperature);
    total += weights[i];
  }
  const GeneratorState st = gen.reserve(1);
  const double u = Philox::to_uniform(Philox::draw(st.seed, 0, st.offset)[0]) * total;
  double acc = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    acc += weights[i];
    if (weights[i] > 0 && u < acc) return int64_t(i);
  }
  return int64_t(best - logits.begin());  // u rounded up to the total: the likeliest token
}

}  // namespace

Tensor GPT2LMHeadModel::generate(const Tensor& input_ids, const GenerateOptions& o) {
  EMBER_CHECK(input_ids.dim() == 2 && input_ids.size(1) > 0, "GPT2LMHeadModel::generate: input_ids must be a ",
              "non-empty [batch, length], got shape ", input_ids.shape());
  EMBER_CHECK(o.max_new_tokens >= 0, "GPT2LMHeadModel::generate: max_new_tokens must be non-negative, got ",
              o.max_new_tokens);
  NoGradGuard ng;
  const bool was_training = is_training();
  eval();
  Generator& gen = o.generator ? *o.generator : default_generator();
  const int64_t batch = input_ids.size(0), vocab = config.vocab_size;
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(batch));
  const std::vector<int64_t> prompt = input_ids.to(Device::cpu()).to(DType::i64).contiguous().to_vector<int64_t>();
  const int64_t len0 = input_ids.size(1);
  for (int64_t b = 0; b < batch; ++b) rows[size_t(b)].assign(prompt.begin() + b * len0, prompt.begin() + (b + 1) * len0);
  GPT2KVCache cache;
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const int64_t len = int64_t(rows[0].size());
    // Cached: the tokens the cache has not seen (the prompt, then one a step). Past n_positions
    // the window slides and every position moves, so the last n_positions are fed whole.
    const bool cached = o.use_cache && len <= config.n_positions;
    const int64_t feed = cached ? len - cache.length() : std::min(len, config.n_positions);
    std::vector<int64_t> window;
    for (const auto& r : rows) window.insert(window.end(), r.end() - feed, r.end());
    const Tensor ids = from_vector(window, {batch, feed}).to(input_ids.device());
    // Only the last position's logits are needed: the head runs on its hidden state alone.
    const Tensor hidden = transformer->forward(ids, Tensor(), cached ? &cache : nullptr).select(1, feed - 1);
    const Tensor last = lm_head->forward(hidden).to(Device::cpu()).to(DType::f32).contiguous();
    const std::vector<float> all = last.to_vector<float>();
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<float> row(all.begin() + b * vocab, all.begin() + (b + 1) * vocab);
      rows[size_t(b)].push_back(sample_token(std::move(row), o, gen));
    }
  }
  train(was_training);
  std::vector<int64_t> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return from_vector(out, {batch, int64_t(rows[0].size())}).to(input_ids.device());
}

LoadReport load_gpt2_weights(Module& model, const std::string& dir) {
  const std::map<std::string, Tensor> weights = load_safetensors(dir + "/model.safetensors");
  // A bare GPT2Model's keys lack the "transformer." of GPT2LMHeadModel's: match the model's naming.
  const StateDict own = model.state_dict();
  const bool model_prefixed = own.count("transformer.wte.weight") > 0;
  const StateDict sd = match_base_model_prefix(weights, model, "transformer.", "wte.weight");
  LoadReport r = model.load_state_dict(sd, /*strict=*/false);
  const bool tied = !own.count("lm_head.weight") ||
                    own.at("lm_head.weight").impl()->storage == own.at("transformer.wte.weight").impl()->storage;
  LoadReport errors;
  for (const auto& k : r.missing_keys)
    if (!(k == "lm_head.weight" && tied)) errors.missing_keys.push_back(k);
  for (const auto& k : r.unexpected_keys)
    if (!ends_with(k, ".attn.bias") && !ends_with(k, ".attn.masked_bias") && !(k == "lm_head.weight" && !model_prefixed))
      errors.unexpected_keys.push_back(k);
  EMBER_CHECK(errors.ok(), "from_pretrained('", dir, "'): the checkpoint does not match the model: ", errors.str());
  return r;
}

std::shared_ptr<GPT2Model> GPT2Model::from_pretrained(const std::string& dir) {
  auto model = std::make_shared<GPT2Model>(GPT2Config::from_json_file(dir + "/config.json"));
  load_gpt2_weights(*model, dir);
  return model;
}

std::shared_ptr<GPT2LMHeadModel> GPT2LMHeadModel::from_pretrained(const std::string& dir) {
  auto model = std::make_shared<GPT2LMHeadModel>(GPT2Config::from_json_file(dir + "/config.json"));
  load_gpt2_weights(*model, dir);
  return model;
}

}  // namespace ember::nn
