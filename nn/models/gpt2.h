// GPT-2 with Hugging Face transformers' module tree and parameter names, so checkpoints move
// between the two: transformer.wte.weight, transformer.h.N.attn.c_attn.weight (Conv1D, [in, out]),
// transformer.ln_f.bias, and lm_head.weight tied to the token embeddings (not stored, as
// transformers omits it). The blocks are in nn/models/gpt2_layers.h.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "nn/io/json_config.h"
#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "nn/models/gpt2_config.h"
#include "nn/models/gpt2_layers.h"
#include "nn/models/pretrained_model.h"

namespace ember::nn {

// The GPT-2 models' shared base, as transformers' GPT2PreTrainedModel: the config, written as
// config.json by save_pretrained, with architectures = {type_name()}.
class GPT2Model;
class GPT2PretrainedModel : public PretrainedModel {
 public:
  JsonConfig config_json() const override;
  GPT2Config config;

  // As transformers': while training with grad on (and no cache), each block runs under
  // ember::checkpoint (autograd/checkpoint.h), so backward recomputes its activations instead of
  // keeping them. The same loss and gradients (dropout included), less memory, more compute.
  bool supports_gradient_checkpointing() const override { return true; }
  void gradient_checkpointing_enable() override;
  void gradient_checkpointing_disable() override;
  bool is_gradient_checkpointing() const override;

 protected:
  GPT2PretrainedModel(std::string type_name, const GPT2Config& c) : PretrainedModel(std::move(type_name)), config(c) {}
  // The model whose blocks gradient checkpointing wraps.
  virtual GPT2Model& gpt2_model() = 0;
  const GPT2Model& gpt2_model() const { return const_cast<GPT2PretrainedModel*>(this)->gpt2_model(); }
};

// transformers' GPT-2 initialisation: Conv1D and embedding weights normal(0, initializer_range),
// biases zero, LayerNorm ones and zeros, and every c_proj weight normal(0, initializer_range /
// sqrt(2 n_layer)) (the residual projections, scaled for the depth).
void init_gpt2_weights(Module& m, const GPT2Config& c);

// transformers' past_key_values for GPT-2: every layer's keys and values of the tokens fed so
// far. Passing the same cache to successive forward calls feeds only the new tokens each time;
// an empty cache (the default-constructed one) starts a sequence.
struct GPT2KVCache {
  std::vector<GPT2LayerCache> layers;
  int64_t length() const {  // tokens cached
    return layers.empty() || !layers[0].keys.defined() ? 0 : layers[0].keys.size(2);
  }
  void clear() { layers.clear(); }
};

class GPT2Model : public GPT2PretrainedModel {
 public:
  explicit GPT2Model(const GPT2Config& c);
  // input_ids [B, L]; attention_mask [B, T + L] (1 = attend, 0 = padding, any numeric dtype; T
  // tokens cached, 0 without a cache) or undefined. Positions are T .. T + L - 1 whatever the
  // padding, as in transformers, and T + L <= n_positions. With a cache, the new tokens' keys
  // and values are appended to it. Returns the last hidden state [B, L, n_embd], after ln_f.
  Tensor forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(), GPT2KVCache* cache = nullptr);
  static std::shared_ptr<GPT2Model> from_pretrained(const std::string& dir);
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList> h;  // GPT2Block
  std::shared_ptr<LayerNorm> ln_f;
  bool gradient_checkpointing = false;

 protected:
  GPT2Model& gpt2_model() override { return *this; }
};

// x W^T with W [vocab_size, n_embd]: the token embeddings (tied) or a weight of its own.
class GPT2LMHead : public Module {
 public:
  explicit GPT2LMHead(const Tensor& weight) : Module("Linear") { this->weight = register_parameter("weight", weight); }
  Tensor forward(const Tensor& x) override;
  Tensor weight;
};

struct CausalLMOutput {
  Tensor loss;    // undefined without labels
  Tensor logits;  // [B, L, vocab_size]
};

struct GenerateOptions {
  int64_t max_new_tokens = 20;
  double temperature = 1.0;  // <= 0: greedy (argmax)
  int64_t top_k = 0;         // > 0: sample among the k most likely tokens only (ties at the k-th kept)
  Generator* generator = nullptr;  // null: the default generator
  // Keep the keys and values of the tokens seen (GPT2KVCache) and feed one new token a step, as
  // long as the sequence fits n_positions; false recomputes the whole context every step.
  bool use_cache = true;
};

class GPT2LMHeadModel : public GPT2PretrainedModel {
 public:
  explicit GPT2LMHeadModel(const GPT2Config& c);
  // labels [B, L]: the loss is the mean cross-entropy of predicting labels[:, t + 1] from position
  // t (shifted inside, as transformers does), -100 ignored.
  // With a cache, as GPT2Model::forward: input_ids are the new tokens only.
  CausalLMOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                         const Tensor& labels = Tensor(), GPT2KVCache* cache = nullptr);
  // Appends options.max_new_tokens tokens to every row of input_ids [B, L] (no padding), each
  // drawn from softmax(logits / temperature) of the last position (top-k filtered), without
  // gradients and in evaluation mode. The context fed to the model is the last n_positions
  // tokens; while the sequence fits, cached keys and values spare recomputing it (use_cache).
  // Returns [B, L + max_new_tokens] (i64).
  Tensor generate(const Tensor& input_ids, const GenerateOptions& options = {});
  static std::shared_ptr<GPT2LMHeadModel> from_pretrained(const std::string& dir);
  std::shared_ptr<GPT2Model> transformer;
  std::shared_ptr<GPT2LMHead> lm_head;

 protected:
  GPT2Model& gpt2_model() override { return *transformer; }
};

// Loads model.safetensors from `dir` into a GPT-2 model. A checkpoint of the bare GPT2Model
// (keys without "transformer.") loads into GPT2LMHeadModel and the other way round; the tied
// lm_head.weight and the attention-mask buffers older checkpoints carry (attn.bias,
// attn.masked_bias) are tolerated; any other missing or unexpected key is an ember::Error listing
// them.
LoadReport load_gpt2_weights(Module& model, const std::string& dir);

}  // namespace ember::nn
