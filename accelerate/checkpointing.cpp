#include "accelerate/checkpointing.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "distributed/operations.h"
#include "accelerate/sharded_checkpoint.h"
#include "distributed/sharded_state.h"
#include "nn/io/atomic_file.h"
#include "nn/io/safetensors.h"

namespace fs = std::filesystem;

namespace ember::distributed {

namespace {

constexpr const char* kStateFile = kAcceleratorStateFileName;
constexpr const char* kFormat = "ember-accelerate-1";
std::string rng_file_name(int rank) { return "random_states_" + std::to_string(rank) + ".json"; }

// Strips a trailing separator so that the parent and the name are the directory's own.
fs::path normalized(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  EMBER_CHECK(fd >= 0, "save_state: cannot open directory '", dir.string(), "': ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems cannot flush a directory; they say so with EINVAL.
  EMBER_CHECK(rc == 0 || err == EINVAL, "save_state: cannot flush directory '", dir.string(), "': ",
              std::strerror(err));
}

void save_object_state(const std::string& path, const ObjectState& s) {
  std::map<std::string, std::string> metadata{{"format", "ember"}};
  put_scalars(metadata, s.scalars);
  nn::save_safetensors(path, s.tensors, metadata);
}

ObjectState load_object_state(const std::string& path) {
  EMBER_CHECK(fs::exists(path), "load_state: ", path, " is missing");
  nn::SafetensorsFile f = nn::load_safetensors_with_metadata(path);
  ObjectState s;
  s.tensors = std::move(f.tensors);
  s.scalars = scalars_from_metadata(f.metadata, path);
  return s;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.good(), "load_state: cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    EMBER_FAIL("load_state: ", path, " is not valid JSON: ", e.what());
  }
}

// Runs `fn` on this process, then makes every process agree: if any failed, all raise (the
// failing process its own error, the others one naming it).
void all_or_nothing(const AcceleratorState& state, const std::string& what, const std::function<void()>& fn) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  if (state.num_processes() == 1) {
    if (!error.empty()) throw Error(error);
    return;
  }
  const std::vector<std::string> all = gather_object(error, state.process_group().get());
  if (!error.empty()) throw Error(error);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) EMBER_FAIL(what, ": process ", r, " failed: ", all[r]);
}

int count_rng_files(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("random_states_", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".json") ++n;
  }
  return n;
}

}  // namespace

std::string checkpoint_file_name(const std::string& kind, size_t index) {
  return index == 0 ? kind + ".safetensors" : kind + "_" + std::to_string(index) + ".safetensors";
}

namespace {

bool is_sharded(const std::vector<bool>& flags, size_t i) { return i < flags.size() && flags[i]; }

// Writes every file into `staging`, then makes it the checkpoint `target` (see the header).
void write_staged_checkpoint(const CheckpointPayload& payload, const AcceleratorState& state, const fs::path& target,
                             const fs::path& parent, const fs::path& staging, const fs::path& previous) {
  const bool main = state.is_main_process();
  all_or_nothing(state, "save_state", [&] {
    if (!main) return;
    fs::create_directories(parent);
    fs::remove_all(staging);
    fs::create_directory(staging);
  });

  all_or_nothing(state, "save_state", [&] {
    const std::string s = staging.string() + "/";
    nlohmann::json rng = {{"rank", state.process_index()},
                          {"seed", payload.rng.seed},
                          {"offset", payload.rng.offset}};
    nn::write_file_atomically(s + rng_file_name(state.process_index()), rng.dump(2) + "\n");
    const int rank = state.process_index(), world = state.num_processes();
    for (size_t i = 0; i < payload.model_pieces.size(); ++i)
      if (payload.model_pieces[i])
        save_shard_file(s + shard_file_name("model", i, rank, world), *payload.model_pieces[i], {});
    for (size_t i = 0; i < payload.optimizer_pieces.size(); ++i)
      if (payload.optimizer_pieces[i])
        save_shard_file(s + shard_file_name("optimizer", i, rank, world), *payload.optimizer_pieces[i],
                        payload.optimizers[i].scalars);
    if (!main) return;
    for (size_t i = 0; i < payload.models.size(); ++i)
      if (!is_sharded(payload.sharded_models, i))
        nn::save_safetensors(s + checkpoint_file_name("model", i), payload.models[i], {{"format", "pt"}});
    for (size_t i = 0; i < payload.optimizers.size(); ++i)
      if (!is_sharded(payload.sharded_optimizers, i))
        save_object_state(s + checkpoint_file_name("optimizer", i), payload.optimizers[i]);
    for (size_t i = 0; i < payload.schedulers.size(); ++i)
      save_object_state(s + checkpoint_file_name("scheduler", i), payload.schedulers[i]);
    for (size_t i = 0; i < payload.custom.size(); ++i)
      save_object_state(s + checkpoint_file_name("custom_checkpoint", i), payload.custom[i]);
    if (payload.scaler) save_object_state(s + kScalerFileName, *payload.scaler);
    nlohmann::json loaders = nlohmann::json::array();
    for (const auto& p : payload.dataloaders) {
      nlohmann::json entry = {{"epoch", p.epoch}, {"position", p.position}};
      if (p.total_batch_size > 0) entry["total_batch_size"] = p.total_batch_size;
      if (p.seed) entry["seed"] = *p.seed;  // a shuffle seed drawn from the generator
      loaders.push_back(entry);
    }
    nlohmann::json meta = {{"format", kFormat},
                           {"num_processes", state.num_processes()},
                           {"models", payload.models.size()},
                           {"sharded_models", payload.sharded_models},
                           {"optimizers", payload.optimizers.size()},
                           {"sharded_optimizers", payload.sharded_optimizers},
                           {"schedulers", payload.schedulers.size()},
                           {"custom_objects", payload.custom.size()},
                           {"scaler", payload.scaler.has_value()},
                           {"dataloaders", loaders},
                           {"accumulation_step", payload.accumulation_step},
                           {"save_iteration", payload.save_iteration},
                           {"backward_passes", payload.backward_passes}};
    nn::write_file_atomically(s + kStateFile, meta.dump(2) + "\n");
  });

  // Every file is flushed; now the directory becomes the checkpoint in one rename.
  all_or_nothing(state, "save_state", [&] {
    if (!main) return;
    sync_directory(staging);
    // A save killed between the two renames below left the checkpoint only as `previous`:
    // it is put back before anything else happens.
    if (!fs::exists(target) && fs::is_directory(previous)) fs::rename(previous, target);
    fs::remove_all(previous);
    if (!fs::exists(target)) {
      fs::rename(staging, target);
      sync_directory(parent);
      return;
    }
    // Replacing: swap the two directories in one step where the filesystem can, so that the
    // name always holds a complete checkpoint; the old one is then under the staging name.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      sync_directory(parent);
      fs::remove_all(staging);
      return;
    }
    // Otherwise two renames; a crash between them leaves the old checkpoint as `previous`,
    // which load_state reads and the next save_state restores.
    fs::rename(target, previous);
    fs::rename(staging, target);
    sync_directory(parent);
    fs::remove_all(previous);
  });
}

// After a failed save (a full disk, a process that failed): the name holds what it held before
// and the half-written staging directory is gone. A checkpoint moved aside for the replacement
// is put back; errors here are not reported over the one that made the save fail.
void undo_failed_save(const fs::path& target, const fs::path& staging, const fs::path& previous) {
  std::error_code ec;
  if (!fs::exists(target, ec) && fs::is_directory(previous, ec)) fs::rename(previous, target, ec);
  fs::remove_all(staging, ec);
}

}  // namespace

void write_checkpoint(const std::string& dir, const CheckpointPayload& payload, const AcceleratorState& state) {
  EMBER_CHECK(!dir.empty(), "save_state: the checkpoint directory is empty");
  const fs::path target = normalized(dir);
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string name = target.filename().string();
  const fs::path staging = parent / ("." + name + ".tmp");
  const fs::path previous = parent / ("." + name + ".old");
  const bool main = state.is_main_process();

  try {
    write_staged_checkpoint(payload, state, target, parent, staging, previous);
  } catch (...) {
    if (main) undo_failed_save(target, staging, previous);
    throw;
  }
}

namespace {

// Fields of the checkpoint's JSON files, each error naming the file and the field.
const nlohmann::json& json_field(const nlohmann::json& obj, const char* key, const std::string& file,
                                 const std::string& field) {
  EMBER_CHECK(obj.is_object() && obj.contains(key), "load_state: ", file, ": '", field, "' is missing");
  return obj.at(key);
}

uint64_t json_unsigned(const nlohmann::json& obj, const char* key, const std::string& file, const std::string& field) {
  const nlohmann::json& v = json_field(obj, key, file, field);
  EMBER_CHECK(v.is_number_unsigned(), "load_state: ", file, ": '", field, "' is ", v.dump(),
              ", expected a non-negative integer");
  return v.get<uint64_t>();
}

int64_t json_count(const nlohmann::json& obj, const char* key, const std::string& file, const std::string& field) {
  const uint64_t v = json_unsigned(obj, key, file, field);
  EMBER_CHECK(v <= uint64_t(INT64_MAX), "load_state: ", file, ": '", field, "' is ", v, ", which is out of range");
  return int64_t(v);
}

CheckpointPayload read_checkpoint_files(const fs::path& root, const nlohmann::json& meta, const AcceleratorState& state);

}  // namespace

CheckpointPayload read_checkpoint(const std::string& dir, const AcceleratorState& state) {
  fs::path root = normalized(dir);
  if (!fs::is_directory(root)) {
    // A save_state killed while replacing this checkpoint (see write_checkpoint) left it here.
    const fs::path previous =
        (root.has_parent_path() ? root.parent_path() : fs::path(".")) / ("." + root.filename().string() + ".old");
    if (fs::exists(previous / kStateFile)) root = previous;
  }
  EMBER_CHECK(fs::is_directory(root), "load_state: checkpoint directory '", dir, "' does not exist");
  const std::string s = root.string() + "/";
  const std::string meta_file = s + kStateFile;
  EMBER_CHECK(fs::exists(meta_file), "load_state: '", root.string(), "' is not a complete checkpoint (", kStateFile,
              " is missing)");
  const nlohmann::json meta = read_json(meta_file);
  EMBER_CHECK(meta.is_object(), "load_state: ", meta_file, " is not a JSON object");
  try {
    return read_checkpoint_files(root, meta, state);
  } catch (const nlohmann::json::exception& e) {
    EMBER_FAIL("load_state: '", root.string(), "' has a malformed entry: ", e.what());
  }
}

namespace {

CheckpointPayload read_checkpoint_files(const fs::path& root, const nlohmann::json& meta, const AcceleratorState& state) {
  const std::string s = root.string() + "/";
  const std::string meta_file = s + kStateFile;
  CheckpointPayload out;
  out.source = root.string();
  EMBER_CHECK(meta.value("format", std::string()) == kFormat, "load_state: ", meta_file, " has format '",
              meta.value("format", std::string()), "', expected '", kFormat, "'");
  const int64_t saved_world = json_count(meta, "num_processes", meta_file, "num_processes");
  EMBER_CHECK(saved_world >= 1 && saved_world <= (int64_t(1) << 20), "load_state: ", meta_file, ": 'num_processes' is ",
              saved_world);
  out.saved_world = int(saved_world);
  const int rng_files = count_rng_files(root);
  // On another world size, a process the saving job did not have keeps its generator.
  out.has_rng = state.process_index() < saved_world;
  const std::string rng_file = s + rng_file_name(state.process_index());
  EMBER_CHECK(!out.has_rng || fs::exists(rng_file), "load_state: ", rng_file,
              " is missing (every process that saved the checkpoint writes its random_states_<rank>.json)");
  EMBER_CHECK(rng_files == saved_world, "load_state: '", root.string(), "' holds ", rng_files,
              " random_states_<rank>.json files but was saved by ", saved_world, " process",
              saved_world == 1 ? "" : "es");

  // Checkpoints from before sharded data parallel have no "sharded_models" / "sharded_optimizers".
  auto flags_of = [&](const char* key) {
    std::vector<bool> out_flags;
    if (!meta.contains(key)) return out_flags;
    const nlohmann::json& flags = meta.at(key);
    EMBER_CHECK(flags.is_array() && std::all_of(flags.begin(), flags.end(), [](const auto& f) { return f.is_boolean(); }),
                "load_state: ", meta_file, ": '", key, "' is ", flags.dump(), ", expected a list of true/false");
    for (const auto& f : flags) out_flags.push_back(f.get<bool>());
    return out_flags;
  };
  out.sharded_models = flags_of("sharded_models");
  out.sharded_optimizers = flags_of("sharded_optimizers");
  for (int64_t i = 0; i < json_count(meta, "models", meta_file, "models"); ++i) {
    const bool sharded = is_sharded(out.sharded_models, size_t(i));
    out.saved_model_pieces.push_back(std::nullopt);
    out.models.emplace_back();
    if (sharded) {
      out.saved_model_pieces.back() = open_saved_object(root.string(), "model", size_t(i), true, int(saved_world));
      continue;
    }
    const std::string file = s + checkpoint_file_name("model", size_t(i));
    EMBER_CHECK(fs::exists(file), "load_state: ", file, " is missing");
    out.models.back() = nn::load_safetensors(file);
  }
  for (int64_t i = 0; i < json_count(meta, "optimizers", meta_file, "optimizers"); ++i) {
    const bool sharded = is_sharded(out.sharded_optimizers, size_t(i));
    out.saved_optimizer_pieces.push_back(std::nullopt);
    out.optimizers.emplace_back();
    if (sharded)
      out.saved_optimizer_pieces.back() = open_saved_object(root.string(), "optimizer", size_t(i), true, int(saved_world));
    else
      out.optimizers.back() = load_object_state(s + checkpoint_file_name("optimizer", size_t(i)));
  }
  for (int64_t i = 0; i < json_count(meta, "schedulers", meta_file, "schedulers"); ++i)
    out.schedulers.push_back(load_object_state(s + checkpoint_file_name("scheduler", size_t(i))));
  for (int64_t i = 0; i < json_count(meta, "custom_objects", meta_file, "custom_objects"); ++i)
    out.custom.push_back(load_object_state(s + checkpoint_file_name("custom_checkpoint", size_t(i))));
  // Checkpoints written before loss scaling existed have no "scaler" entry: no scaler.
  if (meta.contains("scaler")) {
    EMBER_CHECK(meta.at("scaler").is_boolean(), "load_state: ", meta_file, ": 'scaler' is ", meta.at("scaler").dump(),
                ", expected true or false");
    if (meta.at("scaler").get<bool>()) out.scaler = load_object_state(s + kScalerFileName);
  }
  const nlohmann::json& loaders = json_field(meta, "dataloaders", meta_file, "dataloaders");
  EMBER_CHECK(loaders.is_array(), "load_state: ", meta_file, ": 'dataloaders' is not a list");
  for (size_t i = 0; i < loaders.size(); ++i) {
    const std::string field = "dataloaders[" + std::to_string(i) + "]";
    const nlohmann::json& p = loaders[i];
    LoaderPosition pos{json_count(p, "epoch", meta_file, field + ".epoch"),
                       json_count(p, "position", meta_file, field + ".position")};
    if (p.contains("seed")) pos.seed = json_unsigned(p, "seed", meta_file, field + ".seed");
    if (p.contains("total_batch_size"))
      pos.total_batch_size = json_count(p, "total_batch_size", meta_file, field + ".total_batch_size");
    out.dataloaders.push_back(pos);
  }
  out.accumulation_step = json_count(meta, "accumulation_step", meta_file, "accumulation_step");
  out.save_iteration = json_count(meta, "save_iteration", meta_file, "save_iteration");
  // Absent from checkpoints written before it was counted.
  if (meta.contains("backward_passes"))
    out.backward_passes = json_count(meta, "backward_passes", meta_file, "backward_passes");

  if (!out.has_rng) return out;
  const nlohmann::json rng = read_json(rng_file);
  if (rng.is_object() && rng.contains("rank"))
    EMBER_CHECK(rng.at("rank").is_number_integer() && rng.at("rank").get<int64_t>() == state.process_index(),
                "load_state: ", rng_file, ": 'rank' is ", rng.at("rank").dump(), ", expected ", state.process_index());
  out.rng.seed = json_unsigned(rng, "seed", rng_file, "seed");
  out.rng.offset = json_unsigned(rng, "offset", rng_file, "offset");
  return out;
}

}  // namespace

void Checkpointable::validate_state_dict(const ObjectState& state) const {
  const ObjectState mine = state_dict();
  for (const auto& [k, t] : mine.tensors)
    EMBER_CHECK(state.tensors.count(k), "missing tensor '", k, "' (the registered object's state_dict() has it)");
  for (const auto& [k, v] : mine.scalars)
    EMBER_CHECK(state.scalars.count(k), "missing scalar '", k, "' (the registered object's state_dict() has it)");
}

namespace {

// Runs `fn`, naming `file` in any error it raises (of any exception type).
void in_file(const std::string& file, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    EMBER_FAIL("load_state: ", file, ": ", e.what());
  }
}

void check_counts(const CheckpointPayload& saved, const CheckpointTargets& t) {
  const std::string meta_file = saved.source + "/" + kStateFile;
  auto count_check = [&](const char* what, size_t have, size_t prepared) {
    EMBER_CHECK(have == prepared, "load_state: '", saved.source, "' holds ", have, " ", what, " but ", prepared,
                " were prepared (or registered) in this program (", meta_file, ")");
  };
  count_check("models", saved.models.size(), t.models.size());
  count_check("optimizers", saved.optimizers.size(), t.optimizers.size());
  count_check("schedulers", saved.schedulers.size(), t.schedulers.size());
  count_check("registered objects", saved.custom.size(), t.custom.size());
  count_check("data loaders", saved.dataloaders.size(), t.dataloaders.size());
}

FullyShardedDataParallel* sharding_of(const CheckpointTargets& t, size_t model) {
  FullyShardedDataParallel* f = model < t.model_shardings.size() ? t.model_shardings[model] : nullptr;
  return saves_in_pieces(f) ? f : nullptr;
}

// Turns what was saved into what this process loads, whatever the split on either side: a
// sharded model gets its pieces, any other model its whole tensors; an optimizer the state of
// its parameters' slots. Also carries loader positions across a change of the global batch.
void resolve_pieces(CheckpointPayload& saved, const CheckpointTargets& t, const AcceleratorState& state) {
  const std::string prefix = saved.source + "/";
  saved.model_pieces.assign(saved.models.size(), std::nullopt);
  for (size_t i = 0; i < saved.models.size(); ++i) {
    const std::optional<PieceReader>& pieces = saved.saved_model_pieces[i];
    if (FullyShardedDataParallel* f = sharding_of(t, i)) {
      saved.model_pieces[i] =
          pieces ? assemble_model_pieces(*pieces, *f)
                 : assemble_model_pieces(
                       PieceReader::from_tensors(saved.models[i], {}, prefix + checkpoint_file_name("model", i)), *f);
      saved.models[i].clear();
    } else if (pieces) {
      saved.models[i] = assemble_whole_model(*pieces);
    }
  }
  for (size_t i = 0; i < saved.optimizers.size(); ++i) {
    const std::vector<StateSlot> slots =
        i < t.optimizer_slots.size() ? t.optimizer_slots[i] : optimizer_slots(*t.optimizers[i], {});
    const bool split = std::any_of(slots.begin(), slots.end(), [](const StateSlot& s) { return s.local != s.shape; });
    if (const std::optional<PieceReader>& pieces = saved.saved_optimizer_pieces[i]) {
      saved.optimizers[i] = assemble_optimizer_state(*pieces, slots);
    } else if (split) {
      const PieceReader whole = PieceReader::from_tensors(saved.optimizers[i].tensors, saved.optimizers[i].scalars,
                                                          prefix + checkpoint_file_name("optimizer", i));
      saved.optimizers[i] = assemble_optimizer_state(whole, slots);
    }
  }
  // A position counts batches of the global batch it was saved with: under another one (another
  // number of processes) the loader resumes after as many samples, rounded down.
  for (size_t i = 0; i < saved.dataloaders.size(); ++i) {
    LoaderPosition& p = saved.dataloaders[i];
    const int64_t now = t.dataloaders[i]->total_batch_size();
    if (p.total_batch_size <= 0 || p.total_batch_size == now || now <= 0) continue;
    const int64_t samples = p.position * p.total_batch_size;
    if (state.is_main_process())
      std::printf("load_state: data loader %zu was saved with a global batch of %lld and now has %lld: it resumes after "
                  "%lld of the %lld samples it had seen\n",
                  i, (long long)p.total_batch_size, (long long)now, (long long)(samples / now * now), (long long)samples);
    p.position = samples / now;
    p.total_batch_size = now;
  }
  const int now = state.num_processes(), then = saved.saved_world;
  if (then != now && state.is_main_process())
    std::printf("load_state: '%s' was saved by %d process%s and is loaded by %d: %s\n", saved.source.c_str(), then,
                then == 1 ? "" : "es", now,
                now > then ? ("processes " + std::to_string(then) + " and above keep their random generators").c_str()
                           : ("the random generators of processes " + std::to_string(now) + " and above are not used").c_str());
}

// Checks `saved` against `targets`; raises naming the file and the field, changes nothing.
void validate_payload(const CheckpointPayload& saved, const CheckpointTargets& t) {
  const std::string prefix = saved.source + "/";
  const std::string meta_file = prefix + kStateFile;
  for (size_t i = 0; i < t.models.size(); ++i)
    if (!saved.model_pieces[i])  // pieces were checked as they were assembled
      check_model_state(prefix + checkpoint_file_name("model", i), *t.models[i], saved.models[i]);
  for (size_t i = 0; i < t.optimizers.size(); ++i)
    in_file(prefix + checkpoint_file_name("optimizer", i), [&] {
      t.optimizers[i]->validate_state_dict(detail::from_object_state<optim::OptimizerStateDict>(saved.optimizers[i]));
    });
  for (size_t i = 0; i < t.schedulers.size(); ++i)
    in_file(prefix + checkpoint_file_name("scheduler", i), [&] {
      EMBER_CHECK(saved.schedulers[i].tensors.empty(), "unexpected tensor '", saved.schedulers[i].tensors.begin()->first,
                  "' (a scheduler's state is scalars)");
      t.schedulers[i]->validate_state_dict(saved.schedulers[i].scalars);
    });
  for (size_t i = 0; i < t.custom.size(); ++i)
    in_file(prefix + checkpoint_file_name("custom_checkpoint", i), [&] { t.custom[i]->validate_state_dict(saved.custom[i]); });
  for (size_t i = 0; i < t.dataloaders.size(); ++i)
    in_file(meta_file, [&] {
      try {
        t.dataloaders[i]->validate_state(saved.dataloaders[i]);
      } catch (const std::exception& e) {
        EMBER_FAIL("dataloaders[", i, "]: ", e.what());
      }
    });
  if (t.scaler && t.scaler->is_enabled()) {
    EMBER_CHECK(saved.scaler.has_value(), "load_state: ", prefix, kScalerFileName,
                " is missing: the checkpoint was saved without fp16 loss scaling, but this Accelerator uses "
                "mixed_precision 'fp16' and needs the scaler's state");
    // A scratch scaler proves the state loads before anything changes.
    optim::GradScaler probe(t.scaler_options);
    in_file(prefix + kScalerFileName, [&] { probe.load_state_dict(saved.scaler->scalars); });
  }
}

// A registered object's state as it was, its tensors copied (a module's state_dict aliases its
// parameters, which loading overwrites in place).
ObjectState snapshot(const Checkpointable& c) {
  ObjectState s = c.state_dict();
  for (auto& [k, t] : s.tensors)
    if (t.defined()) t = t.clone();
  return s;
}

}  // namespace

CheckpointPayload read_and_validate_checkpoint(const std::string& dir, const CheckpointTargets& targets,
                                               const AcceleratorState& state) {
  CheckpointPayload saved;
  all_or_nothing(state, "load_state", [&] {
    saved = read_checkpoint(dir, state);
    check_counts(saved, targets);
    resolve_pieces(saved, targets, state);
    validate_payload(saved, targets);
  });
  return saved;
}

void apply_checkpoint(const CheckpointPayload& saved, const CheckpointTargets& t, const AcceleratorState& state) {
  const std::string prefix = saved.source + "/";
  // Objects whose loading is their own code go first, so that a refusal there can still be
  // undone: the ones already loaded get their earlier state back.
  std::vector<ObjectState> before;
  for (const Checkpointable* c : t.custom) before.push_back(snapshot(*c));
  size_t loaded = 0;
  try {
    all_or_nothing(state, "load_state", [&] {
      for (; loaded < t.custom.size(); ++loaded)
        in_file(prefix + checkpoint_file_name("custom_checkpoint", loaded),
                [&] { t.custom[loaded]->load_state_dict(saved.custom[loaded]); });
    });
  } catch (...) {
    // The object that refused may be half loaded: it is put back too.
    for (size_t i = 0; i < std::min(loaded + 1, t.custom.size()); ++i) {
      try {
        t.custom[i]->load_state_dict(before[i]);
      } catch (...) {
        // The error that stopped the load is the one to report.
      }
    }
    throw;
  }
  for (size_t i = 0; i < t.models.size(); ++i) {
    if (saved.model_pieces[i])
      load_model_pieces(*sharding_of(t, i), *saved.model_pieces[i]);
    else
      t.models[i]->load_state_dict(saved.models[i], /*strict=*/true);
  }
  for (size_t i = 0; i < t.optimizers.size(); ++i)
    t.optimizers[i]->load_state_dict(detail::from_object_state<optim::OptimizerStateDict>(saved.optimizers[i]));
  for (size_t i = 0; i < t.schedulers.size(); ++i) t.schedulers[i]->load_state_dict(saved.schedulers[i].scalars);
  if (t.scaler && saved.scaler) t.scaler->load_state_dict(saved.scaler->scalars);
  for (size_t i = 0; i < t.dataloaders.size(); ++i) t.dataloaders[i]->restore(saved.dataloaders[i]);
  if (saved.has_rng) default_generator().set_state(saved.rng);
}

void check_model_state(const std::string& file, const nn::Module& model, const nn::StateDict& saved) {
  const nn::StateDict mine = model.state_dict();
  std::vector<std::string> missing, unexpected, shapes, dtypes;
  for (const auto& [k, t] : mine) {
    auto it = saved.find(k);
    if (it == saved.end()) {
      missing.push_back(k);
    } else if (!it->second.defined()) {
      shapes.push_back(k + " is undefined in the checkpoint");
    } else if (it->second.shape() != t.shape()) {
      std::ostringstream os;
      os << k << " is " << it->second.shape() << " in the checkpoint but " << t.shape() << " in the model";
      shapes.push_back(os.str());
    } else if (!nn::loadable_dtype(it->second.dtype(), t.dtype())) {
      std::ostringstream os;
      os << k << " is " << it->second.dtype() << " in the checkpoint but " << t.dtype() << " in the model";
      dtypes.push_back(os.str());
    }
  }
  for (const auto& [k, t] : saved)
    if (!mine.count(k)) unexpected.push_back(k);
  if (missing.empty() && unexpected.empty() && shapes.empty() && dtypes.empty()) return;
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    const size_t shown = std::min<size_t>(v.size(), 8);
    for (size_t i = 0; i < shown; ++i) out += (i ? ", '" : "'") + v[i] + "'";
    if (v.size() > shown) out += ", ... (" + std::to_string(v.size() - shown) + " more)";
    return out;
  };
  std::string msg = "load_state: " + file + " does not match the model (" + model.type_name() + "):";
  if (!missing.empty()) msg += " missing keys " + list(missing) + ";";
  if (!unexpected.empty()) msg += " unexpected keys " + list(unexpected) + ";";
  if (!shapes.empty()) {
    msg += " shape mismatch:";
    for (size_t i = 0; i < shapes.size(); ++i) msg += (i ? ", " : " ") + shapes[i];
    msg += ";";
  }
  if (!dtypes.empty()) {
    msg += " dtype mismatch:";
    for (size_t i = 0; i < dtypes.size(); ++i) msg += (i ? ", " : " ") + dtypes[i];
    msg += ";";
  }
  msg.pop_back();
  throw Error(msg);
}

std::string checkpoints_root(const std::string& project_dir) { return (fs::path(project_dir) / "checkpoints").string(); }

std::string checkpoint_dir_name(int64_t iteration) { return "checkpoint_" + std::to_string(iteration); }

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  if (!fs::is_directory(root)) return out;
  const std::string prefix = "checkpoint_";
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) continue;
    const std::string digits = name.substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (!fs::exists(e.path() / kStateFile)) continue;
    out.emplace_back(std::stoll(digits), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> rotate_checkpoints(const std::string& root, int total_limit) {
  std::vector<std::string> removed;
  if (total_limit < 0) return removed;
  auto all = list_checkpoints(root);
  while (all.size() > size_t(total_limit)) {
    fs::remove_all(all.front().second);
    removed.push_back(all.front().second);
    all.erase(all.begin());
  }
  return removed;
}

}  // namespace ember::distributed
