#include "accelerate/checkpointing.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "distributed/operations.h"
#include "nn/io/atomic_file.h"
#include "nn/io/safetensors.h"

namespace fs = std::filesystem;

namespace ember::distributed {

namespace {

constexpr const char* kStateFile = "accelerator_state.json";
constexpr const char* kFormat = "ember-accelerate-1";
constexpr const char* kScalarPrefix = "scalar.";

std::string format_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

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
  for (const auto& [k, v] : s.scalars) metadata[kScalarPrefix + k] = format_double(v);
  nn::save_safetensors(path, s.tensors, metadata);
}

ObjectState load_object_state(const std::string& path) {
  EMBER_CHECK(fs::exists(path), "load_state: ", path, " is missing");
  nn::SafetensorsFile f = nn::load_safetensors_with_metadata(path);
  ObjectState s;
  s.tensors = std::move(f.tensors);
  const std::string prefix = kScalarPrefix;
  for (const auto& [k, v] : f.metadata) {
    if (k.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    EMBER_CHECK(end && *end == '\0' && !v.empty(), "load_state: ", path, " holds a malformed number '", v,
                "' for '", k.substr(prefix.size()), "'");
    s.scalars[k.substr(prefix.size())] = x;
  }
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
    if (!main) return;
    for (size_t i = 0; i < payload.models.size(); ++i)
      nn::save_safetensors(s + checkpoint_file_name("model", i), payload.models[i], {{"format", "pt"}});
    for (size_t i = 0; i < payload.optimizers.size(); ++i)
      save_object_state(s + checkpoint_file_name("optimizer", i), payload.optimizers[i]);
    for (size_t i = 0; i < payload.schedulers.size(); ++i)
      save_object_state(s + checkpoint_file_name("scheduler", i), payload.schedulers[i]);
    for (size_t i = 0; i < payload.custom.size(); ++i)
      save_object_state(s + checkpoint_file_name("custom_checkpoint", i), payload.custom[i]);
    if (payload.scaler) save_object_state(s + kScalerFileName, *payload.scaler);
    nlohmann::json loaders = nlohmann::json::array();
    for (const auto& p : payload.dataloaders) {
      nlohmann::json entry = {{"epoch", p.epoch}, {"position", p.position}};
      if (p.seed) entry["seed"] = *p.seed;  // a shuffle seed drawn from the generator
      loaders.push_back(entry);
    }
    nlohmann::json meta = {{"format", kFormat},
                           {"num_processes", state.num_processes()},
                           {"models", payload.models.size()},
                           {"optimizers", payload.optimizers.size()},
                           {"schedulers", payload.schedulers.size()},
                           {"custom_objects", payload.custom.size()},
                           {"scaler", payload.scaler.has_value()},
                           {"dataloaders", loaders},
                           {"accumulation_step", payload.accumulation_step},
                           {"save_iteration", payload.save_iteration}};
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
  EMBER_CHECK(fs::exists(s + kStateFile), "load_state: '", root.string(), "' is not a complete checkpoint (",
              kStateFile, " is missing)");
  const nlohmann::json meta = read_json(s + kStateFile);
  CheckpointPayload out;
  try {
    EMBER_CHECK(meta.value("format", std::string()) == kFormat, "load_state: ", s, kStateFile,
                " has format '", meta.value("format", std::string()), "', expected '", kFormat, "'");
    const int saved_world = meta.at("num_processes").get<int>();
    const int rng_files = count_rng_files(root);
    EMBER_CHECK(saved_world == state.num_processes() && rng_files == saved_world, "load_state: '", root.string(),
                "' was saved by ", saved_world, " process", saved_world == 1 ? "" : "es", " (", rng_files,
                " random_states_<rank>.json file", rng_files == 1 ? "" : "s", ") but this job has ",
                state.num_processes(), " process", state.num_processes() == 1 ? "" : "es",
                "; resume with the same number of processes");
    for (size_t i = 0; i < meta.at("models").get<size_t>(); ++i) {
      const std::string file = s + checkpoint_file_name("model", i);
      EMBER_CHECK(fs::exists(file), "load_state: ", file, " is missing");
      out.models.push_back(nn::load_safetensors(file));
    }
    for (size_t i = 0; i < meta.at("optimizers").get<size_t>(); ++i)
      out.optimizers.push_back(load_object_state(s + checkpoint_file_name("optimizer", i)));
    for (size_t i = 0; i < meta.at("schedulers").get<size_t>(); ++i)
      out.schedulers.push_back(load_object_state(s + checkpoint_file_name("scheduler", i)));
    for (size_t i = 0; i < meta.at("custom_objects").get<size_t>(); ++i)
      out.custom.push_back(load_object_state(s + checkpoint_file_name("custom_checkpoint", i)));
    // Checkpoints written before loss scaling existed have no "scaler" entry: no scaler.
    if (meta.value("scaler", false)) out.scaler = load_object_state(s + kScalerFileName);
    for (const auto& p : meta.at("dataloaders")) {
      LoaderPosition pos{p.at("epoch").get<int64_t>(), p.at("position").get<int64_t>()};
      if (p.contains("seed")) pos.seed = p.at("seed").get<uint64_t>();
      out.dataloaders.push_back(pos);
    }
    out.accumulation_step = meta.at("accumulation_step").get<int64_t>();
    out.save_iteration = meta.at("save_iteration").get<int64_t>();
    const std::string rng_file = s + rng_file_name(state.process_index());
    EMBER_CHECK(fs::exists(rng_file), "load_state: ", rng_file, " is missing");
    const nlohmann::json rng = read_json(rng_file);
    out.rng.seed = rng.at("seed").get<uint64_t>();
    out.rng.offset = rng.at("offset").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    EMBER_FAIL("load_state: '", root.string(), "' has a malformed entry: ", e.what());
  }
  return out;
}

void check_model_state(const std::string& file, const nn::Module& model, const nn::StateDict& saved) {
  const nn::StateDict mine = model.state_dict();
  std::vector<std::string> missing, unexpected, shapes;
  for (const auto& [k, t] : mine) {
    auto it = saved.find(k);
    if (it == saved.end()) {
      missing.push_back(k);
    } else if (it->second.shape() != t.shape()) {
      std::ostringstream os;
      os << k << " is " << it->second.shape() << " in the checkpoint but " << t.shape() << " in the model";
      shapes.push_back(os.str());
    }
  }
  for (const auto& [k, t] : saved)
    if (!mine.count(k)) unexpected.push_back(k);
  if (missing.empty() && unexpected.empty() && shapes.empty()) return;
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
