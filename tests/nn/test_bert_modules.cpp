// BERT's modules: the tree and parameter names transformers has, each module's forward equal to
// the unfused computation it stands for, and the models equal to their modules composed.
#include <map>
#include <string>
#include <vector>

#include "core/factory.h"
#include "core/ops.h"
#include "core/rng.h"
#include "nn/models/bert.h"
#include "test_util.h"

using namespace ember;
using namespace ember::nn;

namespace {

BertConfig one_layer_config() {
  BertConfig c = BertConfig::tiny(50);
  c.num_hidden_layers = 1;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.intermediate_size = 16;
  c.max_position_embeddings = 12;
  return c;
}

std::map<std::string, std::string> module_types(Module& m) {
  std::map<std::string, std::string> out;
  for (const auto& [name, module] : m.named_modules()) out[name] = module->type_name();
  return out;
}

Tensor ids() { return from_vector(std::vector<int64_t>{1, 7, 3, 9, 0, 4, 2, 8}, {2, 4}); }
Tensor mask() { return from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0}, {2, 4}); }

}  // namespace

TEST(BertModules, TreeAndParameterNamesAreTransformers) {
  manual_seed(1);
  BertForMaskedLM model(one_layer_config());
  const auto types = module_types(model);
  EXPECT_EQ(types.at("bert.encoder"), "BertEncoder");
  EXPECT_EQ(types.at("bert.encoder.layer.0"), "BertLayer");
  EXPECT_EQ(types.at("bert.encoder.layer.0.attention.self"), "BertSelfAttention");
  EXPECT_EQ(types.at("bert.encoder.layer.0.attention.output"), "BertSelfOutput");
  EXPECT_EQ(types.at("bert.encoder.layer.0.intermediate"), "BertIntermediate");
  EXPECT_EQ(types.at("bert.encoder.layer.0.output"), "BertOutput");
  EXPECT_EQ(types.at("cls"), "BertOnlyMLMHead");
  EXPECT_EQ(types.at("cls.predictions"), "BertLMPredictionHead");
  EXPECT_EQ(types.at("cls.predictions.transform"), "BertPredictionHeadTransform");
  EXPECT_FALSE(types.count("bert.pooler"));

  std::vector<std::string> names;
  for (const auto& [name, t] : model.state_dict()) names.push_back(name);
  const std::string l = "bert.encoder.layer.0.";
  std::vector<std::string> expected{"bert.embeddings.LayerNorm.bias",
                                    "bert.embeddings.LayerNorm.weight",
                                    "bert.embeddings.position_embeddings.weight",
                                    "bert.embeddings.token_type_embeddings.weight",
                                    "bert.embeddings.word_embeddings.weight",
                                    l + "attention.output.LayerNorm.bias",
                                    l + "attention.output.LayerNorm.weight",
                                    l + "attention.output.dense.bias",
                                    l + "attention.output.dense.weight",
                                    l + "attention.self.key.bias",
                                    l + "attention.self.key.weight",
                                    l + "attention.self.query.bias",
                                    l + "attention.self.query.weight",
                                    l + "attention.self.value.bias",
                                    l + "attention.self.value.weight",
                                    l + "intermediate.dense.bias",
                                    l + "intermediate.dense.weight",
                                    l + "output.LayerNorm.bias",
                                    l + "output.LayerNorm.weight",
                                    l + "output.dense.bias",
                                    l + "output.dense.weight",
                                    "cls.predictions.bias",
                                    "cls.predictions.decoder.bias",
                                    "cls.predictions.decoder.weight",
                                    "cls.predictions.transform.LayerNorm.bias",
                                    "cls.predictions.transform.LayerNorm.weight",
                                    "cls.predictions.transform.dense.bias",
                                    "cls.predictions.transform.dense.weight"};
  EXPECT_EQ(names, expected);
  // The decoder is tied: the word embeddings' tensor and the prediction bias, not copies.
  EXPECT_EQ(model.cls->predictions->decoder->weight.impl(), model.bert->embeddings->word_embeddings->weight.impl());
  EXPECT_EQ(model.cls->predictions->decoder->bias.impl(), model.cls->predictions->bias.impl());
  EXPECT_EQ(model.transform_dense, model.cls->predictions->transform->dense);

  BertForSequenceClassification classifier(one_layer_config());
  EXPECT_EQ(module_types(classifier).at("bert.pooler"), "BertPooler");
  EXPECT_TRUE(classifier.state_dict().count("bert.pooler.dense.weight"));
}

TEST(BertModules, EachForwardIsTheUnfusedComputation) {
  manual_seed(2);
  const BertConfig c = one_layer_config();
  BertModel model(c);
  model.eval();
  auto& layer = *model.encoder->layer->at<BertLayer>(0);
  const Tensor x = randn({2, 4, c.hidden_size});
  const Tensor residual = randn({2, 4, c.hidden_size});
  const Shape h{c.hidden_size};

  auto& self_out = *layer.attention->output;
  EXPECT_TRUE(ember::testing::all_close(
      self_out.forward(x, residual),
      layer_norm(linear(x, self_out.dense->weight, self_out.dense->bias) + residual, h, self_out.layer_norm->weight,
                 self_out.layer_norm->bias, c.layer_norm_eps),
      1e-5, 1e-5));

  auto& inter = *layer.intermediate;
  const Tensor up = inter.forward(x);
  EXPECT_EQ(up.shape(), (Shape{2, 4, c.intermediate_size}));
  EXPECT_TRUE(ember::testing::all_close(up, gelu(linear(x, inter.dense->weight, inter.dense->bias)), 1e-5, 1e-5));

  auto& out = *layer.output;
  const Tensor wide = randn({2, 4, c.intermediate_size});
  EXPECT_TRUE(ember::testing::all_close(
      out.forward(wide, residual),
      layer_norm(linear(wide, out.dense->weight, out.dense->bias) + residual, h, out.layer_norm->weight,
                 out.layer_norm->bias, c.layer_norm_eps),
      1e-5, 1e-5));

  const Tensor pooled = model.pooler->forward(x);
  EXPECT_TRUE(ember::testing::all_close(
      pooled, tanh(linear(x.select(1, 0), model.pooler->dense->weight, model.pooler->dense->bias)), 1e-6, 1e-6));
  EXPECT_EMBER_ERROR(model.pooler->forward(x.select(1, 0)), "BertPooler", "[batch, length, hidden]");
}

TEST(BertModules, ModelsAreTheirModulesComposed) {
  manual_seed(3);
  const BertConfig c = one_layer_config();
  BertForMaskedLM mlm(c);
  mlm.eval();
  BertModel& bert = *mlm.bert;
  const Tensor embedded = bert.embeddings->forward(ids(), Tensor());
  const Tensor encoded = bert.encoder->forward(embedded, bert_additive_mask(mask(), DType::f32));
  const Tensor by_layer = bert.encoder->layer->at<BertLayer>(0)->forward(embedded, bert_additive_mask(mask(), DType::f32));
  EXPECT_TRUE(ember::testing::all_close(encoded, by_layer, 0, 0));
  EXPECT_TRUE(ember::testing::all_close(bert.forward(ids(), mask()).last_hidden_state, encoded, 0, 0));
  EXPECT_TRUE(ember::testing::all_close(mlm.forward(ids(), mask()).logits, mlm.cls->forward(encoded), 0, 0));

  BertModel pooled(c);
  pooled.eval();
  const BertModelOutput o = pooled.forward(ids(), mask());
  EXPECT_TRUE(ember::testing::all_close(o.pooler_output, pooled.pooler->forward(o.last_hidden_state), 0, 0));
}
