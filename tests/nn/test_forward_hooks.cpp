// Module forward hooks: the pre and post hooks every forward's enter_forward scope runs, their
// order, replacement outputs and gradients, removal through the handle, hooks registered or
// removed from inside a hook, struct and vector outputs, and forwards that throw.
#include <map>
#include <string>
#include <vector>

#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "nn/models/bert.h"
#include "nn/models/bert_layers.h"
#include "small_bert.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;

namespace {

// Counts calls per module type: a pre and a post hook on every module of `root`.
struct CallCounter {
  std::map<std::string, int> pre, post;
  std::vector<RemovableHandle> handles;
  explicit CallCounter(nn::Module& root) {
    for (auto& [name, m] : root.named_modules()) {
      handles.push_back(m->register_forward_pre_hook([this](nn::Module& mod) { ++pre[mod.type_name()]; }));
      handles.push_back(m->register_forward_hook([this](nn::Module& mod, const Tensor& out) {
        ++post[mod.type_name()];
        return out;
      }));
    }
  }
  void remove_all() {
    for (auto& h : handles) h.remove();
  }
};

// Forwards returning several tensors: a vector, and a struct through its members.
struct Pair {
  Tensor first, second;
};

class TwoOutputs : public nn::Module {
 public:
  TwoOutputs() : Module("TwoOutputs") {}
  std::vector<Tensor> both(const Tensor& x) {
    auto scope = enter_forward();
    return scope.exit(std::vector<Tensor>{x + 1.0, Tensor(), x * 2.0});
  }
  Pair pair(const Tensor& x) {
    auto scope = enter_forward();
    return scope.exit(Pair{x + 1.0, x * 2.0}, &Pair::second);
  }
  Tensor exit_twice(const Tensor& x) {
    auto scope = enter_forward();
    scope.exit(x);
    return scope.exit(x);
  }
};

Tensor token_ids(int64_t batch, int64_t len, int64_t vocab) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < batch * len; ++i) v.push_back((i * 7 + 3) % vocab);
  return from_vector(v, {batch, len});
}

}  // namespace

TEST(ForwardHooks, LinearRunsPreThenPostHooksInRegistrationOrder) {
  nn::Linear lin(4, 3);
  const Tensor x = random_tensor({2, 4});
  const Tensor plain = lin.forward(x);
  std::vector<std::string> log;
  Tensor seen;
  auto h1 = lin.register_forward_pre_hook([&](nn::Module& m) {
    EXPECT_EQ(&m, &lin);
    EXPECT_TRUE(m.in_forward());
    log.push_back("pre1");
  });
  auto h2 = lin.register_forward_hook([&](nn::Module& m, const Tensor& out) {
    EXPECT_EQ(&m, &lin);
    seen = out;
    log.push_back("post1");
    return out;
  });
  auto h3 = lin.register_forward_pre_hook([&](nn::Module&) { log.push_back("pre2"); });
  auto h4 = lin.register_forward_hook([&](nn::Module&, const Tensor& out) {
    log.push_back("post2");
    return out;
  });
  EXPECT_EQ(lin.forward_hook_count(), 4u);
  EXPECT_FALSE(lin.in_forward());
  const Tensor y = lin.forward(x);
  EXPECT_EQ(log, (std::vector<std::string>{"pre1", "pre2", "post1", "post2"}));
  EXPECT_TRUE(all_close(seen, plain, 0, 0));
  EXPECT_TRUE(all_close(y, plain, 0, 0));  // hooks returning their input change nothing
  EXPECT_FALSE(lin.in_forward());
}

TEST(ForwardHooks, SequentialRunsItsChildrensHooksInOrderInsideItsOwn) {
  auto seq = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 5), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(5, 2)});
  std::vector<std::string> log;
  std::vector<RemovableHandle> handles;
  for (auto& [name, m] : seq->named_modules()) {
    const std::string n = name.empty() ? "seq" : name;
    handles.push_back(m->register_forward_pre_hook([&log, n](nn::Module&) { log.push_back(n + ".pre"); }));
    handles.push_back(m->register_forward_hook([&log, n](nn::Module&, const Tensor& out) {
      log.push_back(n + ".post");
      return out;
    }));
  }
  seq->forward(random_tensor({3, 4}));
  EXPECT_EQ(log, (std::vector<std::string>{"seq.pre", "0.pre", "0.post", "1.pre", "1.post", "2.pre", "2.post",
                                           "seq.post"}));
}

TEST(ForwardHooks, BertLayerRunsEachSubmoduleForwardOnce) {
  const nn::BertConfig cfg = ember::testing::one_layer_bert_config(50);
  nn::BertLayer layer(cfg);
  layer.eval();
  const Tensor x = random_tensor({2, 5, cfg.hidden_size});
  const Tensor plain = layer.forward(x, Tensor());
  CallCounter count(layer);
  const Tensor y = layer.forward(x, Tensor());
  EXPECT_TRUE(all_close(y, plain, 0, 0));
  // The attention and outputs read their Linear/LayerNorm/Dropout weights directly (fused
  // kernels), so those children's forwards do not run.
  const std::map<std::string, int> want = {{"BertLayer", 1},     {"BertAttention", 1},    {"BertSelfAttention", 1},
                                           {"BertSelfOutput", 1}, {"BertIntermediate", 1}, {"BertOutput", 1}};
  EXPECT_EQ(count.pre, want);
  EXPECT_EQ(count.post, want);
}

TEST(ForwardHooks, WholeBertModelsCountEveryForwardPerModuleType) {
  nn::BertConfig cfg = ember::testing::one_layer_bert_config(50);
  cfg.num_hidden_layers = 2;
  const Tensor ids = token_ids(2, 6, cfg.vocab_size);
  {
    nn::BertForMaskedLM model(cfg);
    model.eval();
    const Tensor plain = model.forward(ids, Tensor(), Tensor(), ids).loss;
    CallCounter count(model);
    const nn::ModelOutput out = model.forward(ids, Tensor(), Tensor(), ids);
    EXPECT_TRUE(all_close(out.loss, plain, 0, 0));
    const std::map<std::string, int> pre = {
        {"BertForMaskedLM", 1}, {"BertModel", 1},   {"BertEmbeddings", 1},     {"Embedding", 3},
        {"Dropout", 1},         {"BertEncoder", 1}, {"BertLayer", 2},          {"BertAttention", 2},
        {"BertSelfAttention", 2}, {"BertSelfOutput", 2}, {"BertIntermediate", 2}, {"BertOutput", 2},
        {"BertOnlyMLMHead", 1}, {"BertLMPredictionHead", 1}, {"BertPredictionHeadTransform", 1},
        {"LayerNorm", 1},       {"Linear", 1}};  // the transform's LayerNorm and the tied decoder
    EXPECT_EQ(count.pre, pre);
    // Post hooks run once per output tensor: the masked LM's loss and logits, and BertModel's
    // last_hidden_state (it has no pooler here).
    std::map<std::string, int> post = pre;
    post["BertForMaskedLM"] = 2;
    EXPECT_EQ(count.post, post);
    count.remove_all();
    model.forward(ids);
    EXPECT_EQ(count.pre["BertModel"], 1);  // removed hooks run no more
  }
  {
    nn::BertForSequenceClassification model(cfg);
    model.eval();
    CallCounter count(model);
    model.forward(ids);  // no labels: the loss is undefined and gets no post hook
    EXPECT_EQ(count.pre["BertForSequenceClassification"], 1);
    EXPECT_EQ(count.post["BertForSequenceClassification"], 1);
    EXPECT_EQ(count.pre["BertPooler"], 1);
    EXPECT_EQ(count.post["BertModel"], 2);  // last_hidden_state and pooler_output
    EXPECT_EQ(count.pre["Linear"], 2);      // the pooler's dense and the classifier
    EXPECT_EQ(count.pre["BertLayer"], 2);
  }
}

TEST(ForwardHooks, APostHookReplacingTheOutputChangesTheResultAndTheGradients) {
  nn::Linear lin(4, 3);
  const Tensor x = random_tensor({2, 4});
  sum(lin.forward(x)).backward();
  const Tensor plain_grad = lin.weight.grad().clone();
  const Tensor plain = lin.forward(x).detach();
  lin.zero_grad();

  auto handle = lin.register_forward_hook([](nn::Module&, const Tensor& out) { return out * 3.0; });
  const Tensor y = lin.forward(x);
  EXPECT_TRUE(all_close(y, plain * 3.0, 1e-6, 1e-6));
  sum(y).backward();
  ASSERT_TRUE(lin.weight.grad().defined());
  EXPECT_TRUE(all_close(lin.weight.grad(), plain_grad * 3.0, 1e-5, 1e-5));

  // Replacements chain: the next hook sees the previous hook's tensor.
  auto second = lin.register_forward_hook([](nn::Module&, const Tensor& out) { return out + 1.0; });
  EXPECT_TRUE(all_close(lin.forward(x), plain * 3.0 + 1.0, 1e-6, 1e-6));
  handle.remove();
  second.remove();
  EXPECT_TRUE(all_close(lin.forward(x), plain, 0, 0));
}

TEST(ForwardHooks, RemovedHooksNoLongerRunAndCountsFollow) {
  nn::Linear lin(2, 2);
  int a = 0, b = 0, post = 0;
  auto ha = lin.register_forward_pre_hook([&](nn::Module&) { ++a; });
  auto hb = lin.register_forward_pre_hook([&](nn::Module&) { ++b; });
  auto hp = lin.register_forward_hook([&](nn::Module&, const Tensor& out) {
    ++post;
    return out;
  });
  EXPECT_EQ(lin.forward_hook_count(), 3u);
  const Tensor x = ones({1, 2});
  lin.forward(x);
  ha.remove();
  EXPECT_EQ(lin.forward_hook_count(), 2u);
  lin.forward(x);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(post, 2);
  ha.remove();  // twice: nothing
  hp.remove();
  EXPECT_EQ(lin.forward_hook_count(), 1u);
  lin.forward(x);
  EXPECT_EQ(post, 2);
  EXPECT_EQ(b, 3);
  { auto dropped = lin.register_forward_pre_hook([&](nn::Module&) { ++a; }); }  // the handle's end keeps it
  lin.forward(x);
  EXPECT_EQ(a, 2);
  EXPECT_EQ(lin.forward_hook_count(), 2u);

  RemovableHandle outlives;
  {
    nn::Linear gone(2, 2);
    outlives = gone.register_forward_pre_hook([](nn::Module&) {});
  }
  outlives.remove();  // the module is gone: nothing to do, no crash
}

TEST(ForwardHooks, HooksRegisteredOrRemovedInsideAHookAffectTheCallAsDocumented) {
  nn::Linear lin(2, 2);
  const Tensor x = ones({1, 2});
  int late_pre = 0, late_post = 0, victim = 0;
  std::vector<RemovableHandle> added;
  RemovableHandle victim_handle;
  auto adder = lin.register_forward_pre_hook([&](nn::Module& m) {
    if (!added.empty()) return;
    added.push_back(m.register_forward_pre_hook([&](nn::Module&) { ++late_pre; }));
    added.push_back(m.register_forward_hook([&](nn::Module&, const Tensor& out) {
      ++late_post;
      return out;
    }));
    victim_handle.remove();  // registered after this hook, removed before its turn
  });
  victim_handle = lin.register_forward_pre_hook([&](nn::Module&) { ++victim; });
  lin.forward(x);
  EXPECT_EQ(late_pre, 0);
  EXPECT_EQ(late_post, 0);  // registered during this call: runs from the next one
  EXPECT_EQ(victim, 0);
  lin.forward(x);
  EXPECT_EQ(late_pre, 1);
  EXPECT_EQ(late_post, 1);
  EXPECT_EQ(victim, 0);
  EXPECT_EQ(lin.forward_hook_count(), 3u);
}

TEST(ForwardHooks, VectorAndStructOutputsRunPostHooksOnTheChosenTensors) {
  TwoOutputs m;
  std::vector<double> seen;
  auto h = m.register_forward_hook([&](nn::Module&, const Tensor& out) {
    seen.push_back(out.item<double>());
    return out * 10.0;
  });
  const Tensor x = scalar_tensor(1.0);
  const auto outs = m.both(x);
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(seen, (std::vector<double>{2.0, 2.0}));  // each defined tensor, in order
  EXPECT_EQ(outs[0].item<double>(), 20.0);
  EXPECT_FALSE(outs[1].defined());
  EXPECT_EQ(outs[2].item<double>(), 20.0);

  seen.clear();
  const Pair p = m.pair(x);
  EXPECT_EQ(seen, (std::vector<double>{2.0}));  // only the named member
  EXPECT_EQ(p.first.item<double>(), 2.0);
  EXPECT_EQ(p.second.item<double>(), 20.0);

  EXPECT_EMBER_ERROR(m.exit_twice(x), "TwoOutputs", "exited twice");
  EXPECT_FALSE(m.in_forward());
}

TEST(ForwardHooks, AnUndefinedReplacementIsAnError) {
  nn::Linear lin(2, 2);
  auto h = lin.register_forward_hook([](nn::Module&, const Tensor&) { return Tensor(); });
  EXPECT_EMBER_ERROR(lin.forward(ones({1, 2})), "Linear", "forward hook returned an undefined tensor");
  EXPECT_FALSE(lin.in_forward());
}

TEST(ForwardHooks, AThrowingForwardOrHookLeavesTheModuleUsable) {
  nn::Linear lin(4, 3);
  int pre = 0, post = 0;
  bool in_forward_seen = false;
  auto hp = lin.register_forward_pre_hook([&](nn::Module&) { ++pre; });
  auto hq = lin.register_forward_hook([&](nn::Module& m, const Tensor& out) {
    in_forward_seen = m.in_forward();
    ++post;
    return out;
  });
  EXPECT_ANY_THROW(lin.forward(ones({2, 5})));  // wrong feature count
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 0);  // the forward failed: no post hook
  EXPECT_FALSE(lin.in_forward());
  const Tensor y = lin.forward(ones({2, 4}));
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(pre, 2);
  EXPECT_EQ(post, 1);
  EXPECT_TRUE(in_forward_seen);

  // A pre hook that throws stops the forward; removing it makes the module work again.
  auto bad = lin.register_forward_pre_hook([](nn::Module&) { EMBER_FAIL("refused by a hook"); });
  EXPECT_EMBER_ERROR(lin.forward(ones({2, 4})), "refused by a hook");
  EXPECT_FALSE(lin.in_forward());
  EXPECT_EQ(post, 1);
  bad.remove();
  lin.forward(ones({2, 4}));
  EXPECT_EQ(post, 2);

  // Inside a Sequential: the failing child leaves both it and its parent consistent.
  auto seq = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::Linear>(3, 2)});
  int seq_post = 0;
  auto hs = seq->register_forward_hook([&](nn::Module&, const Tensor& out) {
    ++seq_post;
    return out;
  });
  EXPECT_ANY_THROW(seq->forward(ones({1, 7})));
  EXPECT_EQ(seq_post, 0);
  EXPECT_FALSE(seq->in_forward());
  EXPECT_FALSE((*seq)[0]->in_forward());
  EXPECT_EQ(seq->forward(ones({1, 4})).shape(), (Shape{1, 2}));
  EXPECT_EQ(seq_post, 1);
}
