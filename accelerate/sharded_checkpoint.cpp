#include "accelerate/sharded_checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "distributed/operations.h"

namespace ember::distributed {

namespace {

// "state.<i>.<name>" -> i, or -1 when the key is not of that form.
int64_t state_index(const std::string& key, std::string* name) {
  if (key.rfind("state.", 0) != 0) return -1;
  const size_t dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6 || dot + 1 == key.size()) return -1;
  int64_t i = 0;
  for (size_t c = 6; c < dot; ++c) {
    if (key[c] < '0' || key[c] > '9' || i > (int64_t(1) << 40)) return -1;
    i = i * 10 + (key[c] - '0');
  }
  if (name) *name = key.substr(dot + 1);
  return i;
}

// The model's tensors that are not sharded (buffers, frozen parameters), by name.
std::vector<std::pair<std::string, Tensor>> whole_tensors(const FullyShardedDataParallel& f) {
  std::set<std::string> sharded;
  for (const ShardPiece& p : f.shard_pieces()) sharded.insert(p.name);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : f.module()->named_parameters())
    if (!sharded.count(name)) out.push_back({name, t});
  for (const auto& [name, t] : f.module()->named_buffers()) out.push_back({name, t});
  return out;
}

}  // namespace

std::string shard_file_name(const std::string& kind, size_t index, int rank, int world) {
  std::string base = checkpoint_file_name(kind, index);
  base.resize(base.size() - std::string(".safetensors").size());
  char tail[64];
  std::snprintf(tail, sizeof tail, ".shard-%05d-of-%05d.safetensors", rank, world);
  return base + tail;
}

bool saves_in_pieces(const FullyShardedDataParallel* f) {
  return f && f->options().sharding_strategy != ShardingStrategy::NO_SHARD;
}

bool saves_whole(const FullyShardedDataParallel* f) {
  return saves_in_pieces(f) && f->options().state_dict_type == StateDictType::FULL_STATE_DICT;
}

optim::OptimizerStateDict whole_optimizer_state(const optim::OptimizerStateDict& sd,
                                                const std::vector<StateSlot>& slots, ProcessGroup& pg) {
  // A process whose piece of a parameter is empty never stepped it, so it lacks that
  // parameter's state: every process takes the union of the keys (and scalars) all of them hold.
  std::string mine;
  for (const auto& [key, t] : sd.tensors) mine += "t " + key + "\n";
  for (const auto& [key, v] : sd.scalars) {
    char exact[64];
    std::snprintf(exact, sizeof exact, "%a", v);  // hexadecimal: the double round-trips exactly
    mine += "s " + key + " " + exact + "\n";
  }
  std::set<std::string> keys;
  optim::OptimizerStateDict out;
  out.scalars = sd.scalars;
  for (const std::string& theirs : gather_object(mine, &pg)) {
    std::istringstream lines(theirs);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("t ", 0) == 0) {
        keys.insert(line.substr(2));
      } else if (line.rfind("s ", 0) == 0) {
        const size_t space = line.rfind(' ');
        out.scalars.emplace(line.substr(2, space - 2), std::strtod(line.c_str() + space + 1, nullptr));
      }
    }
  }
  NoGradGuard no_grad;
  // Every piece goes at its place in one flat buffer of whole tensors, then one all-reduce. The
  // pieces do not overlap and cover their parameter: summing them, zeros elsewhere, is exact.
  std::vector<std::pair<std::string, int64_t>> pieced;  // key, offset in the buffer
  int64_t total = 0;
  for (const std::string& key : keys) {  // the same order on every process
    const int64_t i = state_index(key, nullptr);
    EMBER_CHECK(i >= 0 && size_t(i) < slots.size(), "save_state: optimizer state '", key, "' belongs to no parameter");
    const StateSlot& s = slots[size_t(i)];
    const auto it = sd.tensors.find(key);
    if (s.piece) {
      pieced.emplace_back(key, total);
      total += numel_of(s.shape);
      continue;
    }
    EMBER_CHECK(it != sd.tensors.end(), "save_state: process ", pg.rank(), " has no optimizer state '", key,
                "' for a parameter every process holds whole");
    out.tensors[key] = it->second;
  }
  if (pieced.empty()) return out;
  Tensor wholes = zeros({total});
  for (const auto& [key, offset] : pieced) {
    const StateSlot& s = slots[size_t(state_index(key, nullptr))];
    const auto it = sd.tensors.find(key);
    if (it == sd.tensors.end() || s.numel == 0) continue;
    EMBER_CHECK(it->second.dtype() == DType::f32, "save_state: optimizer state '", key, "' is ",
                dtype_name(it->second.dtype()), "; FULL_STATE_DICT gathers f32 state");
    wholes.narrow(0, offset + s.first, s.numel).copy_(it->second.contiguous().reshape({s.numel}));
  }
  pg.allreduce(wholes, ReduceOp::Sum)->wait();
  for (const auto& [key, offset] : pieced) {
    const Shape& shape = slots[size_t(state_index(key, nullptr))].shape;
    out.tensors[key] = wholes.narrow(0, offset, numel_of(shape)).reshape(shape);
  }
  return out;
}

std::vector<StateSlot> optimizer_slots(const optim::Optimizer& opt,
                                       const std::vector<std::shared_ptr<FullyShardedDataParallel>>& shardings) {
  std::map<const TensorImpl*, StateSlot> pieces;
  for (const auto& f : shardings)
    if (saves_in_pieces(f.get()))
      for (const ShardPiece& p : f->shard_pieces())
        pieces[p.shard.impl()] = {p.shape, p.first, p.numel, p.shard.shape(), true};
  std::vector<StateSlot> out;
  for (const optim::ParamGroup& g : opt.param_groups())
    for (const Tensor& p : g.params) {
      const auto it = pieces.find(p.impl());
      out.push_back(it != pieces.end() ? it->second : StateSlot{p.shape(), 0, p.numel(), p.shape()});
    }
  return out;
}

PieceMap model_pieces(const FullyShardedDataParallel& f, bool with_whole_tensors) {
  PieceMap out;
  for (const ShardPiece& p : f.shard_pieces())
    if (p.numel > 0) out[p.name] = TensorPiece{p.shape, p.first, p.shard};
  if (with_whole_tensors)
    for (const auto& [name, t] : whole_tensors(f)) out[name] = whole_piece(t);
  return out;
}

PieceMap optimizer_pieces(const optim::OptimizerStateDict& sd, const std::vector<StateSlot>& slots) {
  PieceMap out;
  for (const auto& [key, t] : sd.tensors) {
    const int64_t i = state_index(key, nullptr);
    EMBER_CHECK(i >= 0 && size_t(i) < slots.size(), "save_state: optimizer state '", key, "' belongs to no parameter");
    const StateSlot& s = slots[size_t(i)];
    if (s.numel > 0) out[key] = TensorPiece{s.shape, s.first, t.contiguous().reshape({s.numel})};
  }
  return out;
}

ObjectState assemble_optimizer_state(const PieceReader& saved, const std::vector<StateSlot>& slots) {
  ObjectState out;
  out.scalars = saved.scalars();
  for (const std::string& key : saved.keys()) {
    const int64_t i = state_index(key, nullptr);
    EMBER_CHECK(i >= 0, "load_state: ", saved.source(), ": unexpected optimizer tensor '", key, "'");
    EMBER_CHECK(size_t(i) < slots.size(), "load_state: ", saved.source(), ": state '", key, "' is for parameter ", i,
                " but this optimizer has ", slots.size(), " parameters");
    const StateSlot& s = slots[size_t(i)];
    EMBER_CHECK(saved.shape(key) == s.shape, "load_state: ", saved.source(), ": state '", key, "' has shape ",
                saved.shape(key), " but parameter ", i, " has shape ", s.shape);
    out.tensors[key] = saved.read(key, s.first, s.numel).reshape(s.local);
  }
  return out;
}

nn::StateDict assemble_whole_model(const PieceReader& saved) {
  nn::StateDict out;
  for (const std::string& key : saved.keys()) out[key] = saved.read_whole(key);
  return out;
}

PieceMap assemble_model_pieces(const PieceReader& saved, const FullyShardedDataParallel& f) {
  PieceMap out;
  std::set<std::string> expected;
  auto check_shape = [&](const std::string& name, const Shape& shape) {
    expected.insert(name);
    EMBER_CHECK(saved.contains(name), "load_state: ", saved.source(), " holds no '", name, "', which the model has");
    EMBER_CHECK(saved.shape(name) == shape, "load_state: ", saved.source(), ": '", name, "' has shape ",
                saved.shape(name), " but the model's has shape ", shape);
  };
  for (const ShardPiece& p : f.shard_pieces()) {
    check_shape(p.name, p.shape);
    out[p.name] = TensorPiece{p.shape, p.first, saved.read(p.name, p.first, p.numel)};
  }
  for (const auto& [name, t] : whole_tensors(f)) {
    check_shape(name, t.shape());
    out[name] = TensorPiece{t.shape(), 0, saved.read(name, 0, t.numel())};
  }
  for (const std::string& key : saved.keys())
    EMBER_CHECK(expected.count(key), "load_state: ", saved.source(), " holds '", key, "', which the model does not have");
  return out;
}

void load_model_pieces(FullyShardedDataParallel& f, const PieceMap& pieces) {
  {
    NoGradGuard no_grad;
    for (const ShardPiece& p : f.shard_pieces())
      if (p.numel > 0) Tensor(p.shard).copy_(pieces.at(p.name).values);
    for (auto& [name, t] : whole_tensors(f)) Tensor(t).copy_(pieces.at(name).values.reshape(t.shape()));
  }
  f.shards_changed();
  // Stages 1 and 2 keep replicated parameters: every rank's slices come back now, so the
  // model reads as loaded before its next forward.
  if (f.options().sharding_strategy != ShardingStrategy::FULL_SHARD) f.sync_parameters();
}

PieceReader open_saved_object(const std::string& dir, const std::string& kind, size_t index, bool in_pieces,
                              int world) {
  const std::string s = dir + "/";
  if (!in_pieces) return PieceReader::open_whole(s + checkpoint_file_name(kind, index));
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) files.push_back(s + shard_file_name(kind, index, r, world));
  return PieceReader::open_shards(files);
}

nn::StateDict merge_checkpoint_model(const std::string& dir, size_t index) {
  const std::string meta_file = dir + "/" + kAcceleratorStateFileName;
  std::ifstream in(meta_file);
  EMBER_CHECK(in.good(), "merge-weights: ", meta_file, " is missing: '", dir, "' is not a checkpoint of save_state");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    EMBER_FAIL("merge-weights: ", meta_file, " is not valid JSON: ", e.what());
  }
  EMBER_CHECK(meta.is_object() && meta.contains("models") && meta.at("models").is_number_unsigned() &&
                  meta.contains("num_processes") && meta.at("num_processes").is_number_unsigned(),
              "merge-weights: ", meta_file, " has no 'models' and 'num_processes' counts");
  const size_t models = meta.at("models").get<size_t>();
  EMBER_CHECK(index < models, "merge-weights: '", dir, "' holds ", models, " model", models == 1 ? "" : "s",
              "; there is no model ", index);
  bool in_pieces = false;
  if (meta.contains("sharded_models")) {
    const nlohmann::json& flags = meta.at("sharded_models");
    EMBER_CHECK(flags.is_array() && flags.size() == models && flags[index].is_boolean(), "merge-weights: ", meta_file,
                ": 'sharded_models' is ", flags.dump(), ", expected ", models, " true/false");
    in_pieces = flags[index].get<bool>();
  }
  return assemble_whole_model(open_saved_object(dir, "model", index, in_pieces, meta.at("num_processes").get<int>()));
}

}  // namespace ember::distributed
