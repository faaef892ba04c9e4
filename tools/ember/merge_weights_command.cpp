// `ember merge-weights`: one model.safetensors from a checkpoint of save_state, whole tensors
// assembled from the shard files every process wrote under sharded data parallel (or copied from
// the checkpoint's one model file), as Accelerate's `merge-weights` does. Needs neither the
// model's code nor the processes that trained it.
#include <filesystem>
#include <iostream>

#include "accelerate/sharded_checkpoint.h"
#include "command_line.h"
#include "core/error.h"
#include "nn/io/safetensors.h"
#include "subcommands.h"

namespace ember::cli {

std::string merge_weights_usage() {
  return "usage: ember merge-weights CHECKPOINT_DIR OUTPUT_DIR [--model_index I]\n"
         "\n"
         "Writes OUTPUT_DIR/model.safetensors: model I (default 0) of a checkpoint written by\n"
         "Accelerator::save_state, with every tensor whole. A model saved in pieces by sharded data\n"
         "parallel (model.shard-0000r-of-0000N.safetensors) is assembled from all N files; a missing\n"
         "or truncated one is an error naming it. The file loads with transformers'\n"
         "from_pretrained beside the model's config.json.\n"
         "\n"
         "options:\n"
         "  --model_index I   which prepared model (the order of prepare), default 0\n"
         "  -h, --help        show this text\n";
}

int merge_weights_command(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  int index = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << merge_weights_usage();
      return 0;
    }
    std::string name, value;
    bool has_value = false;
    if (split_flag(arg, name, value, has_value)) {
      if (name != "model_index") throw UsageError("unknown option '" + arg + "'");
      if (!has_value) {
        if (i + 1 >= args.size()) throw UsageError(arg + " needs a number");
        value = args[++i];
      }
      index = parse_int(value, "--model_index");
      if (index < 0) throw UsageError("--model_index must be >= 0, got " + value);
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-') throw UsageError("unknown option '" + arg + "'");
    dirs.push_back(arg);
  }
  if (dirs.size() != 2) throw UsageError("expected CHECKPOINT_DIR and OUTPUT_DIR");
  const nn::StateDict merged = distributed::merge_checkpoint_model(dirs[0], size_t(index));
  std::filesystem::create_directories(dirs[1]);
  const std::string out = (std::filesystem::path(dirs[1]) / "model.safetensors").string();
  nn::save_safetensors(out, merged, {{"format", "pt"}});
  std::cout << out << "\n";
  return 0;
}

}  // namespace ember::cli
