#include "accelerate/launch_config.h"

#include <sys/stat.h>
#include <unistd.h>
#include <pwd.h>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "accelerate/fsdp_env.h"
#include "accelerate/fsdp_settings.h"
#include "core/error.h"
#include "core/usable_cpus.h"

namespace ember::distributed {

namespace {

const char* kComputeEnvironment = "LOCAL_MACHINE";
const std::vector<std::string> kMixedPrecisions = {"no", "fp16", "bf16"};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

std::string file_source(const std::string& path) { return "config file '" + path + "'"; }

// A short description of a YAML value for error messages: its text, or its kind.
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing (null)";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Scalar: return "'" + node.Scalar() + "'";
    default: return "an undefined value";
  }
}

[[noreturn]] void bad_value(const std::string& source, const std::string& key, const std::string& expected,
                            const YAML::Node& node) {
  EMBER_FAIL(source, ": key '", key, "': expected ", expected, ", got ", describe(node));
}

int read_int(const std::string& source, const std::string& key, const YAML::Node& node) {
  if (!node.IsScalar()) bad_value(source, key, "an integer", node);
  try {
    return node.as<int>();
  } catch (const YAML::Exception&) {
    bad_value(source, key, "an integer", node);
  }
}

double read_double(const std::string& source, const std::string& key, const YAML::Node& node) {
  if (!node.IsScalar()) bad_value(source, key, "a number", node);
  try {
    return node.as<double>();
  } catch (const YAML::Exception&) {
    bad_value(source, key, "a number", node);
  }
}

bool read_bool(const std::string& source, const std::string& key, const YAML::Node& node) {
  if (!node.IsScalar()) bad_value(source, key, "true or false", node);
  try {
    return node.as<bool>();
  } catch (const YAML::Exception&) {
    bad_value(source, key, "true or false", node);
  }
}

std::string read_string(const std::string& source, const std::string& key, const YAML::Node& node) {
  if (!node.IsScalar()) bad_value(source, key, "a string", node);
  return node.Scalar();
}

std::optional<DistributedType> parse_distributed_type(const std::string& name) {
  for (DistributedType t :
       {DistributedType::NO, DistributedType::MULTI_CPU, DistributedType::MULTI_GPU, DistributedType::FSDP})
    if (name == distributed_type_name(t)) return t;
  return std::nullopt;
}

// The fsdp_config mapping; nullopt when it is empty (or null), as Accelerate writes it for jobs
// without sharding.
std::optional<FSDPOptions> read_fsdp_config(const std::string& source, const YAML::Node& node) {
  if (node.IsNull() || (node.IsMap() && node.size() == 0)) return std::nullopt;
  if (!node.IsMap()) bad_value(source, "fsdp_config", "a mapping of fsdp_* keys", node);
  FSDPOptions options;
  for (const auto& entry : node) {
    EMBER_CHECK(entry.first.IsScalar(), source, ": fsdp_config: keys must be names, got ", describe(entry.first));
    const std::string key = entry.first.Scalar();
    const FSDPSetting* setting = find_fsdp_setting(key);
    EMBER_CHECK(setting, source, ": unknown key 'fsdp_config.", key, "' (known keys: ", fsdp_setting_keys(), ")");
    const std::string text = read_string(source, "fsdp_config." + key, entry.second);
    try {
      setting->parse(options, text);
    } catch (const Error& e) {
      EMBER_FAIL(source, ": key 'fsdp_config.", key, "': ", e.what());
    }
  }
  return options;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in, file_source(path), ": cannot open (", std::strerror(errno), ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  EMBER_CHECK(!in.bad(), file_source(path), ": read error");
  return ss.str();
}

// Refuses a mapping, at any depth, that holds the same key twice. YAML::Load keeps both entries
// and a reader of the map sees one of them, so `num_processes: 2` further down a file would
// silently override `num_processes: 8` above it. The node tree does not keep where a key was
// written for every entry, so the first document is walked as parser events instead.
class DuplicateKeyFinder : public YAML::EventHandler {
 public:
  explicit DuplicateKeyFinder(std::string source) : source_(std::move(source)) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node_done(mark, nullptr); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    const auto it = anchored_scalars_.find(anchor);
    node_done(mark, it == anchored_scalars_.end() ? nullptr : &it->second);
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor, const std::string& value) override {
    if (anchor != YAML::NullAnchor) anchored_scalars_[anchor] = value;
    node_done(mark, &value);
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(false);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(true);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Collection {
    bool is_map = false;
    std::string path;                  // "outer.inner[2]"; empty at the top level
    bool expecting_key = true;         // maps: the next node is a key
    std::string key;                   // maps: the key whose value comes next
    std::map<std::string, int> lines;  // maps: key -> line it was written on (1-based)
    int index = 0;                     // sequences: the next item's index
  };

  // Where the next node of the innermost collection sits, for naming nested keys.
  std::string child_path() const {
    if (stack_.empty()) return "";
    const Collection& c = stack_.back();
    if (!c.is_map) return c.path + "[" + std::to_string(c.index) + "]";
    const std::string key = c.expecting_key ? "?" : c.key;  // a mapping or list used as a key
    return c.path.empty() ? key : c.path + "." + key;
  }

  void open(bool is_map) {
    Collection c;
    c.is_map = is_map;
    c.path = child_path();
    stack_.push_back(std::move(c));
  }

  void close() {
    stack_.pop_back();
    node_done(YAML::Mark(), nullptr);
  }

  // One node of the innermost collection is complete; `scalar` is its text when it has one.
  void node_done(const YAML::Mark& mark, const std::string* scalar) {
    if (stack_.empty()) return;
    Collection& c = stack_.back();
    if (!c.is_map) {
      ++c.index;
      return;
    }
    if (!c.expecting_key) {
      c.expecting_key = true;
      return;
    }
    c.expecting_key = false;
    c.key = scalar ? *scalar : "?";
    if (!scalar) return;  // a key that is not a name is refused when the file is read
    const int line = mark.line + 1;
    const auto [it, inserted] = c.lines.emplace(*scalar, line);
    if (inserted) return;
    const std::string name = c.path.empty() ? *scalar : c.path + "." + *scalar;
    EMBER_FAIL(source_, ": key '", name, "' appears twice, on line ", it->second, " and on line ", line,
               " (YAML would silently keep only one of the two values); remove one of them");
  }

  std::string source_;
  std::vector<Collection> stack_;
  std::map<YAML::anchor_t, std::string> anchored_scalars_;
};

// Only the first document is read, as YAML::Load does.
void check_no_duplicate_keys(const std::string& source, const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DuplicateKeyFinder finder(source);
  parser.HandleNextDocument(finder);
}

std::string home_directory() {
  if (const char* home = std::getenv("HOME"); home && *home) return home;
  if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) return pw->pw_dir;
  EMBER_FAIL("launch config: cannot find the home directory (HOME is unset); set EMBER_CONFIG_FILE");
}

}  // namespace

const char* distributed_type_name(DistributedType type) {
  switch (type) {
    case DistributedType::NO: return "NO";
    case DistributedType::MULTI_CPU: return "MULTI_CPU";
    case DistributedType::MULTI_GPU: return "MULTI_GPU";
    case DistributedType::FSDP: return "FSDP";
  }
  return "NO";
}

const std::vector<std::string>& launch_config_keys() {
  static const std::vector<std::string> keys = {
      "compute_environment", "distributed_type", "num_processes", "num_machines",
      "machine_rank", "main_process_ip", "main_process_port", "mixed_precision",
      "gradient_accumulation_steps", "num_cpu_threads_per_process", "use_cpu", "max_restarts",
      "monitor_interval", "heartbeat_timeout", "rdzv_timeout", "fsdp_config"};
  return keys;
}

DistributedType LaunchConfig::distributed_type() const {
  if (fsdp) return DistributedType::FSDP;
  if (num_processes <= 1 && num_machines <= 1) return DistributedType::NO;
  return use_cpu ? DistributedType::MULTI_CPU : DistributedType::MULTI_GPU;
}

int LaunchConfig::local_processes() const { return num_machines > 0 ? num_processes / num_machines : 0; }

std::string LaunchConfig::master_address() const {
  return main_process_ip.empty() ? std::string("127.0.0.1") : main_process_ip;
}

void LaunchConfig::validate(const std::string& source) const {
  EMBER_CHECK(num_processes >= 1, source, ": key 'num_processes': expected a positive integer, got ", num_processes);
  EMBER_CHECK(num_machines >= 1, source, ": key 'num_machines': expected a positive integer, got ", num_machines);
  EMBER_CHECK(machine_rank >= 0, source, ": key 'machine_rank': expected a non-negative integer, got ",
              machine_rank);
  EMBER_CHECK(machine_rank < num_machines, source, ": key 'machine_rank': ", machine_rank,
              " is not below num_machines (", num_machines, ")");
  EMBER_CHECK(num_processes % num_machines == 0, source, ": key 'num_processes': ", num_processes,
              " processes cannot be split evenly over num_machines (", num_machines,
              "); num_processes is the total over all machines");
  EMBER_CHECK(main_process_port >= 1 && main_process_port <= 65535, source,
              ": key 'main_process_port': expected a port in 1..65535, got ", main_process_port);
  EMBER_CHECK(std::find(kMixedPrecisions.begin(), kMixedPrecisions.end(), mixed_precision) != kMixedPrecisions.end(),
              source, ": key 'mixed_precision': unknown value '", mixed_precision, "' (expected one of: ",
              join(kMixedPrecisions), ")");
  EMBER_CHECK(gradient_accumulation_steps >= 1, source,
              ": key 'gradient_accumulation_steps': expected a positive integer, got ", gradient_accumulation_steps);
  EMBER_CHECK(num_cpu_threads_per_process >= 0, source,
              ": key 'num_cpu_threads_per_process': expected a non-negative integer (0: automatic), got ",
              num_cpu_threads_per_process);
  EMBER_CHECK(max_restarts >= 0, source, ": key 'max_restarts': expected a non-negative integer, got ", max_restarts);
  EMBER_CHECK(std::isfinite(monitor_interval) && monitor_interval > 0, source,
              ": key 'monitor_interval': expected a positive number of seconds, got ", monitor_interval);
  EMBER_CHECK(std::isfinite(heartbeat_timeout) && heartbeat_timeout >= 0, source,
              ": key 'heartbeat_timeout': expected a number of seconds >= 0 (0: never), got ", heartbeat_timeout);
  EMBER_CHECK(std::isfinite(rdzv_timeout) && rdzv_timeout > 0, source,
              ": key 'rdzv_timeout': expected a positive number of seconds, got ", rdzv_timeout);
  EMBER_CHECK(main_process_ip.find_first_of(" \t\n") == std::string::npos, source,
              ": key 'main_process_ip': '", main_process_ip, "' is not a host name or address");
  if (fsdp) check_fsdp_options(*fsdp, source);
}

LaunchConfig LaunchConfig::load_yaml(const std::string& path) {
  const std::string source = file_source(path);
  const std::string text = read_text_file(path);
  YAML::Node root;
  try {
    root = YAML::Load(text);
    check_no_duplicate_keys(source, text);
  } catch (const YAML::ParserException& e) {
    EMBER_FAIL(source, ": YAML syntax error at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg);
  }
  LaunchConfig config;
  if (root.IsNull()) return config;  // an empty file: every default
  EMBER_CHECK(root.IsMap(), source, ": expected a mapping of 'key: value' lines at the top level, got ",
              describe(root));

  std::optional<DistributedType> stated_type;
  bool has_fsdp_config = false;
  for (const auto& entry : root) {
    EMBER_CHECK(entry.first.IsScalar(), source, ": keys must be names, got ", describe(entry.first));
    const std::string key = entry.first.Scalar();
    const YAML::Node& value = entry.second;
    if (key == "compute_environment") {
      const std::string env = read_string(source, key, value);
      EMBER_CHECK(env == kComputeEnvironment, source, ": key 'compute_environment': unknown value '", env,
                  "' (expected ", kComputeEnvironment, ")");
    } else if (key == "distributed_type") {
      const std::string name = read_string(source, key, value);
      stated_type = parse_distributed_type(name);
      EMBER_CHECK(stated_type, source, ": key 'distributed_type': unknown value '", name,
                  "' (expected one of: NO, MULTI_CPU, MULTI_GPU, FSDP)");
    } else if (key == "num_processes") {
      config.num_processes = read_int(source, key, value);
    } else if (key == "num_machines") {
      config.num_machines = read_int(source, key, value);
    } else if (key == "machine_rank") {
      config.machine_rank = read_int(source, key, value);
    } else if (key == "main_process_ip") {
      config.main_process_ip = value.IsNull() ? std::string() : read_string(source, key, value);
    } else if (key == "main_process_port") {
      config.main_process_port = read_int(source, key, value);
    } else if (key == "mixed_precision") {
      config.mixed_precision = read_string(source, key, value);
    } else if (key == "gradient_accumulation_steps") {
      config.gradient_accumulation_steps = read_int(source, key, value);
    } else if (key == "num_cpu_threads_per_process") {
      config.num_cpu_threads_per_process = read_int(source, key, value);
    } else if (key == "use_cpu") {
      config.use_cpu = read_bool(source, key, value);
    } else if (key == "max_restarts") {
      config.max_restarts = read_int(source, key, value);
    } else if (key == "monitor_interval") {
      config.monitor_interval = read_double(source, key, value);
    } else if (key == "heartbeat_timeout") {
      config.heartbeat_timeout = read_double(source, key, value);
    } else if (key == "rdzv_timeout") {
      config.rdzv_timeout = read_double(source, key, value);
    } else if (key == "fsdp_config") {
      has_fsdp_config = true;
      config.fsdp = read_fsdp_config(source, value);
    } else {
      EMBER_FAIL(source, ": unknown key '", key, "' (known keys: ", join(launch_config_keys()), ")");
    }
  }
  if (stated_type == DistributedType::FSDP) {
    EMBER_CHECK(has_fsdp_config, source, ": key 'distributed_type': FSDP needs an fsdp_config mapping (",
                "'fsdp_config: {}' for the defaults)");
    if (!config.fsdp) config.fsdp = FSDPOptions{};
  }
  config.validate(source);

  if (stated_type) {
    const int total = config.num_processes;
    EMBER_CHECK(*stated_type != DistributedType::NO || (total == 1 && config.num_machines == 1), source,
                ": key 'distributed_type': NO contradicts num_processes ", total, " and num_machines ",
                config.num_machines, " (NO means one process in total)");
    EMBER_CHECK(*stated_type == DistributedType::NO || *stated_type == DistributedType::FSDP || total > 1, source,
                ": key 'distributed_type': ",
                distributed_type_name(*stated_type), " needs num_processes above 1, got ", total);
    EMBER_CHECK(*stated_type != DistributedType::MULTI_GPU || !config.use_cpu, source,
                ": key 'distributed_type': MULTI_GPU contradicts use_cpu: true");
    EMBER_CHECK(*stated_type == DistributedType::FSDP || !config.fsdp, source, ": key 'distributed_type': ",
                distributed_type_name(*stated_type), " contradicts the fsdp_config settings (use FSDP, or remove them)");
    if (*stated_type == DistributedType::MULTI_CPU) config.use_cpu = true;
  }
  return config;
}

std::string LaunchConfig::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "compute_environment" << YAML::Value << kComputeEnvironment;
  out << YAML::Key << "distributed_type" << YAML::Value << distributed_type_name(distributed_type());
  out << YAML::Key << "num_processes" << YAML::Value << num_processes;
  out << YAML::Key << "num_machines" << YAML::Value << num_machines;
  out << YAML::Key << "machine_rank" << YAML::Value << machine_rank;
  if (!main_process_ip.empty()) out << YAML::Key << "main_process_ip" << YAML::Value << main_process_ip;
  out << YAML::Key << "main_process_port" << YAML::Value << main_process_port;
  // Quoted: a bare `no` is the boolean false to YAML 1.1 readers (PyYAML among them).
  out << YAML::Key << "mixed_precision" << YAML::Value << YAML::SingleQuoted << mixed_precision;
  out << YAML::Key << "gradient_accumulation_steps" << YAML::Value << gradient_accumulation_steps;
  out << YAML::Key << "num_cpu_threads_per_process" << YAML::Value << num_cpu_threads_per_process;
  out << YAML::Key << "use_cpu" << YAML::Value << use_cpu;
  out << YAML::Key << "max_restarts" << YAML::Value << max_restarts;
  out << YAML::Key << "monitor_interval" << YAML::Value << monitor_interval;
  out << YAML::Key << "heartbeat_timeout" << YAML::Value << heartbeat_timeout;
  out << YAML::Key << "rdzv_timeout" << YAML::Value << rdzv_timeout;
  if (fsdp) {
    out << YAML::Key << "fsdp_config" << YAML::Value << YAML::BeginMap;
    for (const FSDPSetting& setting : fsdp_settings())
      if (const std::optional<std::string> text = setting.format(*fsdp))
        out << YAML::Key << setting.key << YAML::Value << *text;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  EMBER_CHECK(out.good(), "launch config: cannot write YAML: ", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

void LaunchConfig::save_yaml(const std::string& path) const {
  validate("launch config to be written to '" + path + "'");
  const std::string text = to_yaml();
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  EMBER_CHECK(!ec, file_source(path), ": cannot create directory '", dir.string(), "' (", ec.message(), ")");

  // Same directory as the target, so rename() replaces it in one step: a reader sees the old
  // file or the new one, never half of one.
  std::string tmp = (dir / (target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = mkstemp(tmp.data());
  EMBER_CHECK(fd >= 0, file_source(path), ": cannot create a temporary file in '", dir.string(), "' (",
              std::strerror(errno), ")");
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      EMBER_FAIL(file_source(path), ": cannot write '", tmp, "' (", std::strerror(err), ")");
    }
    written += size_t(n);
  }
  // Readable like any config file (mkstemp creates it 0600).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  const bool synced = ::fsync(fd) == 0;
  const int sync_err = errno;
  ::close(fd);
  if (!synced) {
    ::unlink(tmp.c_str());
    EMBER_FAIL(file_source(path), ": cannot flush '", tmp, "' (", std::strerror(sync_err), ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    EMBER_FAIL(file_source(path), ": cannot replace the file (", std::strerror(err), ")");
  }
}

std::string default_config_path() {
  if (const char* file = std::getenv("EMBER_CONFIG_FILE"); file && *file) return file;
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg)
    return std::string(xdg) + "/ember/default_config.yaml";
  return home_directory() + "/.config/ember/default_config.yaml";
}

std::optional<LaunchConfig> load_default_config() {
  const std::string path = default_config_path();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  return LaunchConfig::load_yaml(path);
}

int available_cpus() { return usable_cpus(); }

int threads_per_process(const LaunchConfig& config) {
  if (config.num_cpu_threads_per_process > 0) return config.num_cpu_threads_per_process;
  return std::max(1, available_cpus() / std::max(1, config.local_processes()));
}

std::vector<std::pair<std::string, std::string>> rank_environment(const LaunchConfig& config, int local_rank) {
  const int local = config.local_processes();
  const std::string threads = std::to_string(threads_per_process(config));
  std::vector<std::pair<std::string, std::string>> env = {
      {"MASTER_ADDR", config.master_address()},
      {"MASTER_PORT", std::to_string(config.main_process_port)},
      {"RANK", std::to_string(config.machine_rank * local + local_rank)},
      {"WORLD_SIZE", std::to_string(config.num_processes)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(local)},
      {"GROUP_RANK", std::to_string(config.machine_rank)},
      // Marks RANK and WORLD_SIZE as the launcher's, so that Slurm's or MPI's variables, also
      // present when `ember launch` runs under srun or mpirun, do not contradict them.
      {"EMBER_LAUNCHED_BY", "ember launch"},
      {"EMBER_MIXED_PRECISION", config.mixed_precision},
      {"EMBER_GRADIENT_ACCUMULATION_STEPS", std::to_string(config.gradient_accumulation_steps)},
      {"EMBER_USE_CPU", config.use_cpu ? "1" : "0"},
      {"EMBER_NUM_THREADS", threads},
      {"OMP_NUM_THREADS", threads},
  };
  // Stated either way, so a variable left in the launcher's own environment decides nothing.
  if (config.fsdp) {
    for (auto& variable : fsdp_env(*config.fsdp)) env.push_back(std::move(variable));
  } else {
    env.emplace_back("EMBER_USE_FSDP", "false");
  }
  return env;
}

}  // namespace ember::distributed
