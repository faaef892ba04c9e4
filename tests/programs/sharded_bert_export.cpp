// One process of a sharded Accelerator job whose checkpoint transformers must load after
// `ember merge-weights` (tests/golden/check_transformers_interop.sh starts it through
// `ember launch --use_fsdp ...`):
//
//   sharded_bert_export GOLDEN_DIR OUT_DIR
//
// loads the golden BertForMaskedLM (GOLDEN_DIR/mlm), trains three AdamW steps on the golden
// batch (the same rows on every process, so the weights do not depend on the world size),
// writes save_state(OUT_DIR/ckpt) (shard files under sharded data parallel), and on the main
// process OUT_DIR/mlm/config.json and OUT_DIR/mlm/ember_outputs.safetensors (the batch and
// Ember's logits in eval mode), the files make_bert_golden.py --verify reads beside the
// model.safetensors that merge-weights writes there. Exit status 0 when every step succeeded.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "accelerate/accelerator.h"
#include "bert_golden_support.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "nn/io/safetensors.h"
#include "nn/models/pretrained.h"
#include "optim/sgd_adam.h"

using namespace ember;
using distributed::Accelerator;
namespace golden_support = ember::testing::bert_golden;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: sharded_bert_export GOLDEN_DIR OUT_DIR\n");
    return 2;
  }
  const std::string golden = argv[1], out = argv[2];
  try {
    Accelerator acc;
    EMBER_CHECK(acc.options().fsdp.has_value(), "sharded_bert_export: start it with --use_fsdp");
    const golden_support::Golden g(golden, "mlm");
    auto model = nn::from_pretrained<nn::BertForMaskedLM>(golden + "/mlm");
    auto opt = std::make_shared<optim::AdamW>(model->parameters(),
                                              optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.01});
    auto [m, o] = acc.prepare(model, opt);
    for (int step = 0; step < golden_support::kAdamWSteps; ++step) {
      acc.backward(golden_support::run(*model, g).loss);
      o->step();
      o->zero_grad();
    }
    acc.save_state(out + "/ckpt");
    model->eval();
    Tensor logits;
    {
      NoGradGuard no_grad;
      logits = golden_support::run(*model, g, false).logits;
    }
    if (acc.is_main_process()) {
      std::filesystem::create_directories(out + "/mlm");
      nn::BertConfig config = model->config;
      config.architectures = {"BertForMaskedLM"};
      config.save(out + "/mlm/config.json");
      nn::save_safetensors(out + "/mlm/ember_outputs.safetensors",
                           {{"input_ids", g.at("input_ids")},
                            {"attention_mask", g.at("attention_mask")},
                            {"token_type_ids", g.at("token_type_ids")},
                            {"logits", logits}});
    }
    acc.wait_for_everyone();
    std::printf("rank %d: sharded export written\n", acc.process_index());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "sharded_bert_export: %s\n", e.what());
    return 1;
  }
}
