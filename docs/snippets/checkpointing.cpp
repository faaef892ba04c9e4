// Checkpointing with the Accelerator (docs/quickstart.md, docs/accelerate_mapping.md): automatic
// checkpoint directories under project_dir with total_limit, save_state / load_state, objects
// registered for checkpointing, the save/load hooks, save_model and save. The program trains,
// saves, trains on, restores, and checks that the restored weights are the saved ones; it
// prints "resumed" and exits 0 when they are. It writes under ./runs/checkpointing.
#include <ember/accelerate.h>
#include <ember/ember.h>

#include <cstdio>
#include <filesystem>
#include <memory>

using namespace ember;

// [progress]
// Anything with state_dict() / load_state_dict() can ride along in the checkpoint.
struct TrainingProgress {
  int64_t steps = 0;
  double best_loss = 1e30;
  std::map<std::string, double> state_dict() const { return {{"steps", double(steps)}, {"best_loss", best_loss}}; }
  void load_state_dict(const std::map<std::string, double>& s) {
    steps = int64_t(s.at("steps"));
    best_loss = s.at("best_loss");
  }
};
// [/progress]

std::shared_ptr<data::TensorDataset> make_dataset(int64_t n) {
  Tensor x = randn({n, 4});
  Tensor y = matmul(x, ones({4, 1}));
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", x}, {"y", y}});
}

double train_steps(Accelerator& acc, const std::shared_ptr<nn::Linear>& m, AcceleratedOptimizer& o,
                   AcceleratedDataLoader& l, TrainingProgress& progress, int64_t steps) {
  double loss_value = 0;
  for (auto& batch : l) {
    if (steps-- == 0) break;
    Tensor loss = nn::functional::mse_loss(m->forward(batch["x"]), batch["y"]);
    acc.backward(loss);
    o.step();
    o.zero_grad();
    loss_value = loss.item<double>();
    progress.steps += 1;
    progress.best_loss = std::min(progress.best_loss, loss_value);
  }
  return loss_value;
}

int main() {
  std::filesystem::remove_all("runs/checkpointing");
  // [setup]
  Accelerator acc({.project_dir = "runs/checkpointing", .total_limit = 2});
  acc.set_seed(0);
  auto model = std::make_shared<nn::Linear>(4, 1);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  data::DataLoader loader(make_dataset(256), {.batch_size = 16, .shuffle = true});
  auto [m, o, l] = acc.prepare(model, opt, loader);
  TrainingProgress progress;
  acc.register_for_checkpointing(progress);
  // [/setup]

  // [hooks]
  // A save hook may edit or drop entries of `weights` (one per prepared model) before they are
  // written; a load hook may drop models it restores itself. Here they only report.
  auto save_hook = acc.register_save_state_pre_hook(
      [&](std::vector<std::shared_ptr<nn::Module>>& models, std::vector<nn::StateDict>& weights,
          const std::string& dir) { acc.print("saving", models.size(), "model(s) to", dir); });
  auto load_hook = acc.register_load_state_pre_hook(
      [&](std::vector<std::shared_ptr<nn::Module>>& models, const std::string& dir) {
        acc.print("loading", models.size(), "model(s) from", dir);
      });
  // [/hooks]

  train_steps(acc, m, *o, *l, progress, 5);
  // [save]
  std::string first = acc.save_state();   // runs/checkpointing/checkpoints/checkpoint_0
  int64_t next = acc.save_iteration();     // 1: the number the next automatic checkpoint gets
  // [/save]
  const nn::StateDict saved = acc.unwrap_model(m)->state_dict();
  acc.save_state();                        // checkpoint_1
  train_steps(acc, m, *o, *l, progress, 5);
  acc.save_state();                        // checkpoint_2; total_limit = 2 removes checkpoint_0
  save_hook.remove();

  // [load]
  acc.load_state("runs/checkpointing/checkpoints/checkpoint_1");  // or acc.load_state(): the latest
  // [/load]
  load_hook.remove();
  const bool first_removed = !std::filesystem::exists(first);
  const double restored = (acc.unwrap_model(m)->state_dict().at("weight") - saved.at("weight")).abs().max().item<double>();
  std::printf("checkpoint_0 removed by total_limit: %s; restored weights differ by %g; %lld steps recorded\n",
              first_removed ? "yes" : "no", restored, (long long)progress.steps);

  // [export]
  acc.save_model(m, "runs/checkpointing/final");  // model.safetensors; also a shared_ptr or *model
  acc.save(acc.unwrap_model(m)->state_dict(), "runs/checkpointing/weights.safetensors");
  // [/export]

  // [save-pretrained]
  // transformers' model.save_pretrained(dir, is_main_process=accelerator.is_main_process,
  //                                      save_function=accelerator.save): written once, by the main process
  auto bert = acc.prepare(std::make_shared<nn::BertForSequenceClassification>(nn::BertConfig::tiny(100)));
  acc.unwrap_model(bert)->save_pretrained("runs/checkpointing/bert", {.is_main_process = acc.is_main_process(),
                                                                      .save_function = acc.save_function()});
  // [/save-pretrained]
  const bool pretrained = std::filesystem::exists("runs/checkpointing/bert/config.json") &&
                          std::filesystem::exists("runs/checkpointing/bert/model.safetensors");

  // [resume-mid-epoch]
  // load_state() puts every prepared loader back where it was saved. To skip batches by hand:
  acc.skip_first_batches(*l, 3);  // the next pass starts at the epoch's fourth batch
  // [/resume-mid-epoch]
  const bool ok = first_removed && restored == 0.0 && progress.steps == 5 && next == 1 && pretrained;
  std::printf("%s\n", ok ? "resumed" : "FAILED");
  return ok ? 0 : 1;
}
