// LaunchConfig: YAML round trips, every validation error, the default path, the rank environment.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>

#include "accelerate/launch_config.h"
#include "fsdp_options_expect.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

using ember::testing::TempDir;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Sets or unsets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void expect_same(const LaunchConfig& a, const LaunchConfig& b) {
  EXPECT_EQ(a.num_processes, b.num_processes);
  EXPECT_EQ(a.num_machines, b.num_machines);
  EXPECT_EQ(a.machine_rank, b.machine_rank);
  EXPECT_EQ(a.main_process_ip, b.main_process_ip);
  EXPECT_EQ(a.main_process_port, b.main_process_port);
  EXPECT_EQ(a.mixed_precision, b.mixed_precision);
  EXPECT_EQ(a.gradient_accumulation_steps, b.gradient_accumulation_steps);
  EXPECT_EQ(a.num_cpu_threads_per_process, b.num_cpu_threads_per_process);
  EXPECT_EQ(a.use_cpu, b.use_cpu);
  EXPECT_EQ(a.max_restarts, b.max_restarts);
  EXPECT_EQ(a.monitor_interval, b.monitor_interval);
  EXPECT_EQ(a.heartbeat_timeout, b.heartbeat_timeout);
  ASSERT_EQ(a.fsdp.has_value(), b.fsdp.has_value());
  if (a.fsdp) ember::testing::expect_same_fsdp_options(*a.fsdp, *b.fsdp);
}

TEST(LaunchConfig, DefaultsMatchASingleProcess) {
  LaunchConfig c;
  EXPECT_EQ(c.num_processes, 1);
  EXPECT_EQ(c.num_machines, 1);
  EXPECT_EQ(c.machine_rank, 0);
  EXPECT_EQ(c.main_process_port, 29500);
  EXPECT_EQ(c.mixed_precision, "no");
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.master_address(), "127.0.0.1");
  EXPECT_EQ(c.distributed_type(), DistributedType::NO);
  EXPECT_EQ(c.local_processes(), 1);
  EXPECT_NO_THROW(c.validate("defaults"));
}

TEST(LaunchConfig, DistributedTypeIsDerived) {
  LaunchConfig c;
  c.num_processes = 4;
  EXPECT_EQ(c.distributed_type(), DistributedType::MULTI_GPU);
  c.use_cpu = true;
  EXPECT_EQ(c.distributed_type(), DistributedType::MULTI_CPU);
  c.num_processes = 1;
  EXPECT_EQ(c.distributed_type(), DistributedType::NO);
  EXPECT_STREQ(distributed_type_name(DistributedType::MULTI_CPU), "MULTI_CPU");
}

TEST(LaunchConfig, RoundTripsThroughYaml) {
  TempDir dir("ember_launch_config");
  std::vector<LaunchConfig> cases(4);
  cases[1].num_processes = 8;
  cases[1].num_machines = 2;
  cases[1].machine_rank = 1;
  cases[1].main_process_ip = "10.0.0.7";
  cases[1].main_process_port = 1234;
  cases[1].mixed_precision = "bf16";
  cases[1].gradient_accumulation_steps = 4;
  cases[1].num_cpu_threads_per_process = 3;
  cases[1].use_cpu = true;
  cases[2].num_processes = 2;
  cases[2].mixed_precision = "fp16";
  cases[2].max_restarts = 3;
  cases[2].monitor_interval = 0.25;
  cases[2].heartbeat_timeout = 90;
  cases[3].main_process_ip = "node-0.cluster";
  cases[3].mixed_precision = "no";
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const std::string path = dir.file("config_" + std::to_string(i) + ".yaml");
    cases[i].save_yaml(path);
    expect_same(LaunchConfig::load_yaml(path), cases[i]);
  }
  const std::string text = read_file(dir.file("config_1.yaml"));
  for (const char* fragment : {"num_processes: 8", "num_machines: 2", "machine_rank: 1", "main_process_ip: 10.0.0.7",
                               "main_process_port: 1234", "mixed_precision: 'bf16'", "gradient_accumulation_steps: 4",
                               "num_cpu_threads_per_process: 3", "use_cpu: true", "distributed_type: MULTI_CPU",
                               "compute_environment: LOCAL_MACHINE"})
    EXPECT_NE(text.find(fragment), std::string::npos) << fragment << " missing from\n" << text;
  // `no` is quoted so YAML 1.1 readers do not take it for false.
  EXPECT_NE(read_file(dir.file("config_3.yaml")).find("mixed_precision: 'no'"), std::string::npos);
  // Unset address: not written.
  EXPECT_EQ(read_file(dir.file("config_0.yaml")).find("main_process_ip"), std::string::npos);
}

TEST(LaunchConfig, SaveIsAtomicAndCreatesDirectories) {
  TempDir dir("ember_launch_config");
  const std::string path = dir.file("a/b/default_config.yaml");
  LaunchConfig c;
  c.num_processes = 2;
  c.save_yaml(path);
  c.num_processes = 6;
  c.save_yaml(path);  // replaces
  EXPECT_EQ(LaunchConfig::load_yaml(path).num_processes, 6);
  EXPECT_EQ(dir.names(), std::vector<std::string>{"a"});
  // No temporary files left next to it.
  std::vector<std::string> inside;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("a/b")))
    inside.push_back(entry.path().filename().string());
  EXPECT_EQ(inside, std::vector<std::string>{"default_config.yaml"});
}

TEST(LaunchConfig, SavingAnInvalidConfigWritesNothing) {
  TempDir dir("ember_launch_config");
  LaunchConfig c;
  c.num_processes = 0;
  EXPECT_EMBER_ERROR(c.save_yaml(dir.file("c.yaml")), "num_processes", "0");
  EXPECT_TRUE(dir.names().empty());
}

TEST(LaunchConfig, ReadsPartialEmptyAndAccelerateStyleFiles) {
  TempDir dir("ember_launch_config");
  write_file(dir.file("empty.yaml"), "");
  expect_same(LaunchConfig::load_yaml(dir.file("empty.yaml")), LaunchConfig{});

  write_file(dir.file("partial.yaml"), "num_processes: 3\nmixed_precision: fp16\n");
  const LaunchConfig partial = LaunchConfig::load_yaml(dir.file("partial.yaml"));
  EXPECT_EQ(partial.num_processes, 3);
  EXPECT_EQ(partial.mixed_precision, "fp16");
  EXPECT_EQ(partial.main_process_port, 29500);

  // As Accelerate writes it; MULTI_CPU means the ranks run on the CPU.
  write_file(dir.file("accelerate.yaml"),
             "compute_environment: LOCAL_MACHINE\n"
             "distributed_type: MULTI_CPU\n"
             "machine_rank: 0\n"
             "mixed_precision: 'no'\n"
             "num_machines: 1\n"
             "num_processes: 4\n"
             "use_cpu: false\n");
  const LaunchConfig acc = LaunchConfig::load_yaml(dir.file("accelerate.yaml"));
  EXPECT_EQ(acc.num_processes, 4);
  EXPECT_EQ(acc.mixed_precision, "no");
  EXPECT_TRUE(acc.use_cpu);
  EXPECT_EQ(acc.distributed_type(), DistributedType::MULTI_CPU);

  // A bare `no` (a YAML 1.1 boolean) still reads as the mode "no"; yes/no work for use_cpu.
  write_file(dir.file("bare.yaml"), "mixed_precision: no\nuse_cpu: yes\n");
  const LaunchConfig bare = LaunchConfig::load_yaml(dir.file("bare.yaml"));
  EXPECT_EQ(bare.mixed_precision, "no");
  EXPECT_TRUE(bare.use_cpu);
}

// Writes `text` to a file and expects loading it to fail with a message holding the file name
// and every fragment.
void expect_load_error(const std::string& text, const std::vector<std::string>& fragments) {
  TempDir dir("ember_launch_config");
  const std::string path = dir.file("bad.yaml");
  write_file(path, text);
  SCOPED_TRACE("file content:\n" + text);
  try {
    LaunchConfig::load_yaml(path);
    ADD_FAILURE() << "expected ember::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << "message does not name the file: " << message;
    for (const std::string& f : fragments)
      EXPECT_NE(message.find(f), std::string::npos) << "missing '" << f << "' in: " << message;
  }
}

TEST(LaunchConfig, WrongTypesNameKeyAndValue) {
  expect_load_error("num_processes: two\n", {"num_processes", "integer", "'two'"});
  expect_load_error("num_machines: 1.5\n", {"num_machines", "integer", "'1.5'"});
  expect_load_error("machine_rank: [0, 1]\n", {"machine_rank", "integer", "a list"});
  expect_load_error("main_process_port: {a: 1}\n", {"main_process_port", "integer", "a mapping"});
  expect_load_error("gradient_accumulation_steps:\n", {"gradient_accumulation_steps", "integer", "null"});
  expect_load_error("num_cpu_threads_per_process: 99999999999\n",
                    {"num_cpu_threads_per_process", "integer", "'99999999999'"});
  expect_load_error("use_cpu: maybe\n", {"use_cpu", "true or false", "'maybe'"});
  expect_load_error("mixed_precision: [bf16]\n", {"mixed_precision", "string", "a list"});
  expect_load_error("main_process_ip: [1, 2]\n", {"main_process_ip", "string", "a list"});
  expect_load_error("max_restarts: often\n", {"max_restarts", "integer", "'often'"});
  expect_load_error("monitor_interval: soon\n", {"monitor_interval", "number", "'soon'"});
  expect_load_error("heartbeat_timeout: [1]\n", {"heartbeat_timeout", "number", "a list"});
}

TEST(LaunchConfig, OutOfRangeValuesNameKeyAndValue) {
  expect_load_error("num_processes: -2\n", {"num_processes", "positive", "-2"});
  expect_load_error("num_processes: 0\n", {"num_processes", "positive", "0"});
  expect_load_error("num_machines: -1\n", {"num_machines", "positive", "-1"});
  expect_load_error("machine_rank: -1\n", {"machine_rank", "non-negative", "-1"});
  expect_load_error("num_machines: 2\nnum_processes: 2\nmachine_rank: 2\n",
                    {"machine_rank", "2 is not below num_machines (2)"});
  expect_load_error("num_machines: 2\nnum_processes: 3\n", {"num_processes", "3", "split evenly", "(2)"});
  expect_load_error("main_process_port: 0\n", {"main_process_port", "1..65535", "0"});
  expect_load_error("main_process_port: 70000\n", {"main_process_port", "70000"});
  expect_load_error("gradient_accumulation_steps: 0\n", {"gradient_accumulation_steps", "positive", "0"});
  expect_load_error("num_cpu_threads_per_process: -4\n", {"num_cpu_threads_per_process", "-4"});
  expect_load_error("mixed_precision: fp8\n", {"mixed_precision", "'fp8'", "no, fp16, bf16"});
  expect_load_error("main_process_ip: 'a b'\n", {"main_process_ip", "'a b'"});
  expect_load_error("max_restarts: -1\n", {"max_restarts", "non-negative", "-1"});
  expect_load_error("monitor_interval: 0\n", {"monitor_interval", "positive", "0"});
  expect_load_error("heartbeat_timeout: -5\n", {"heartbeat_timeout", ">= 0", "-5"});
  expect_load_error("rdzv_timeout: 0\n", {"rdzv_timeout", "positive", "0"});
}

TEST(LaunchConfig, UnknownKeysListTheKnownOnes) {
  expect_load_error("num_process: 2\n", {"unknown key 'num_process'", "known keys", "num_processes", "num_machines",
                                         "machine_rank", "main_process_ip", "main_process_port", "mixed_precision",
                                         "gradient_accumulation_steps", "num_cpu_threads_per_process", "use_cpu",
                                         "distributed_type", "fsdp_config"});
}

TEST(LaunchConfig, DuplicateKeysAreRefusedNamingBothLines) {
  // The later value would otherwise win silently, even when the two agree.
  expect_load_error("num_processes: 8\nmixed_precision: bf16\nnum_processes: 2\n",
                    {"key 'num_processes' appears twice", "line 1", "line 3"});
  expect_load_error("num_processes: 2\nnum_processes: 2\n", {"key 'num_processes' appears twice", "line 1", "line 2"});
  // Quoting does not make it another key; a flow mapping is a mapping too.
  expect_load_error("use_cpu: true\n\n'use_cpu': false\n", {"key 'use_cpu'", "line 1", "line 3"});
  expect_load_error("{num_machines: 1, num_machines: 2}\n", {"key 'num_machines' appears twice", "line 1"});
  // An alias of a key is that key.
  expect_load_error("&k num_processes: 2\n*k : 4\n", {"key 'num_processes' appears twice", "line 1", "line 2"});
  // At every depth, named by its path; the duplicate is found before the values are read.
  expect_load_error("num_processes: 2\n"
                    "fsdp_config:\n"
                    "  fsdp_sharding_strategy: FULL_SHARD\n"
                    "  fsdp_offload_params: false\n"
                    "  fsdp_sharding_strategy: SHARD_GRAD_OP\n",
                    {"key 'fsdp_config.fsdp_sharding_strategy' appears twice", "line 3", "line 5"});
  expect_load_error("plugins:\n  - name: a\n    options: {x: 1, y: 2, x: 3}\n",
                    {"key 'plugins[0].options.x' appears twice", "line 3"});
  expect_load_error("outer:\n  - a: 1\n  - b: 1\n    b: 2\n", {"key 'outer[1].b' appears twice", "line 3", "line 4"});

  // The same name in two different mappings is no duplicate: the file fails for its unknown key.
  TempDir dir("ember_launch_config");
  write_file(dir.file("sections.yaml"), "first:\n  x: 1\nsecond:\n  x: 1\n");
  try {
    LaunchConfig::load_yaml(dir.file("sections.yaml"));
    ADD_FAILURE() << "expected ember::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'first'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("twice"), std::string::npos) << e.what();
  }
  // What `ember config` writes has no duplicates, and keeps loading.
  LaunchConfig c;
  c.num_processes = 4;
  c.main_process_ip = "10.0.0.1";
  c.save_yaml(dir.file("written.yaml"));
  expect_same(LaunchConfig::load_yaml(dir.file("written.yaml")), c);
}

TEST(LaunchConfig, StatedDistributedTypeMustAgree) {
  expect_load_error("distributed_type: DEEPSPEED\n",
                    {"distributed_type", "'DEEPSPEED'", "NO, MULTI_CPU, MULTI_GPU, FSDP"});
  expect_load_error("distributed_type: FSDP\nnum_processes: 2\n", {"distributed_type", "FSDP", "fsdp_config"});
  expect_load_error("distributed_type: MULTI_GPU\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n",
                    {"distributed_type", "MULTI_GPU", "contradicts the fsdp_config"});
  expect_load_error("distributed_type: NO\nnum_processes: 2\n", {"distributed_type", "NO", "num_processes 2"});
  expect_load_error("distributed_type: MULTI_GPU\nnum_processes: 2\nuse_cpu: true\n",
                    {"distributed_type", "MULTI_GPU", "use_cpu"});
  expect_load_error("distributed_type: MULTI_CPU\n", {"distributed_type", "MULTI_CPU", "above 1", "1"});
  expect_load_error("compute_environment: AMAZON_SAGEMAKER\n", {"compute_environment", "'AMAZON_SAGEMAKER'"});
}

TEST(LaunchConfig, FsdpConfigRoundTripsThroughYaml) {
  TempDir dir("ember_launch_config");
  std::vector<LaunchConfig> cases(3);
  cases[0].num_processes = 4;
  cases[0].use_cpu = true;
  cases[0].fsdp = FSDPOptions{};
  cases[1].num_processes = 2;
  cases[1].fsdp = FSDPOptions{.sharding_strategy = ShardingStrategy::SHARD_GRAD_OP,
                              .auto_wrap_policy = AutoWrapPolicy::SIZE_BASED_WRAP,
                              .transformer_layer_cls_to_wrap = {"BertLayer", "BertPooler"},
                              .min_num_params = 4096,
                              .reshard_after_forward = false,
                              .forward_prefetch = false,
                              .backward_prefetch = BackwardPrefetch::NO_PREFETCH,
                              .mixed_precision = {.param_dtype = DType::bf16, .reduce_dtype = DType::bf16},
                              .activation_checkpointing = true,
                              .state_dict_type = StateDictType::FULL_STATE_DICT};
  cases[2].fsdp = FSDPOptions{.sharding_strategy = ShardingStrategy::NO_SHARD};  // one process
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const std::string path = dir.file("fsdp_" + std::to_string(i) + ".yaml");
    cases[i].save_yaml(path);
    const LaunchConfig loaded = LaunchConfig::load_yaml(path);
    expect_same(loaded, cases[i]);
    EXPECT_EQ(loaded.distributed_type(), DistributedType::FSDP);
  }
  const std::string text = read_file(dir.file("fsdp_1.yaml"));
  for (const char* fragment :
       {"distributed_type: FSDP", "fsdp_config:", "  fsdp_sharding_strategy: SHARD_GRAD_OP",
        "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP", "  fsdp_transformer_layer_cls_to_wrap: BertLayer,BertPooler",
        "  fsdp_min_num_params: 4096", "  fsdp_reshard_after_forward: false", "  fsdp_forward_prefetch: false",
        "  fsdp_backward_prefetch: NO_PREFETCH", "  fsdp_activation_checkpointing: true",
        "  fsdp_state_dict_type: FULL_STATE_DICT", "  fsdp_reduce_dtype: bf16", "  fsdp_param_dtype: bf16"})
    EXPECT_NE(text.find(fragment), std::string::npos) << fragment << " missing from\n" << text;
  // Fields left to their default that have no text are not written.
  const std::string plain = read_file(dir.file("fsdp_0.yaml"));
  EXPECT_EQ(plain.find("fsdp_reshard_after_forward"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("fsdp_transformer_layer_cls_to_wrap"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("fsdp_offload_params"), std::string::npos) << plain;
  // Without sharding there is no fsdp_config at all.
  LaunchConfig none;
  none.num_processes = 2;
  EXPECT_EQ(none.to_yaml().find("fsdp"), std::string::npos);
}

TEST(LaunchConfig, ReadsAccelerateStyleFsdpFiles) {
  TempDir dir("ember_launch_config");
  // As `accelerate config` writes it (with the strategy as a name).
  write_file(dir.file("fsdp.yaml"),
             "compute_environment: LOCAL_MACHINE\n"
             "distributed_type: FSDP\n"
             "fsdp_config:\n"
             "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
             "  fsdp_backward_prefetch: BACKWARD_PRE\n"
             "  fsdp_forward_prefetch: false\n"
             "  fsdp_offload_params: false\n"
             "  fsdp_sharding_strategy: SHARD_GRAD_OP\n"
             "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
             "  fsdp_transformer_layer_cls_to_wrap: BertLayer\n"
             "machine_rank: 0\n"
             "mixed_precision: bf16\n"
             "num_machines: 1\n"
             "num_processes: 2\n"
             "use_cpu: false\n");
  const LaunchConfig c = LaunchConfig::load_yaml(dir.file("fsdp.yaml"));
  ASSERT_TRUE(c.fsdp.has_value());
  EXPECT_EQ(c.fsdp->sharding_strategy, ShardingStrategy::SHARD_GRAD_OP);
  EXPECT_EQ(c.fsdp->transformer_layer_cls_to_wrap, std::vector<std::string>{"BertLayer"});
  EXPECT_FALSE(c.fsdp->forward_prefetch);
  EXPECT_EQ(c.distributed_type(), DistributedType::FSDP);

  // `fsdp_config: {}`, which Accelerate writes for every job, leaves sharding off ...
  write_file(dir.file("empty.yaml"), "distributed_type: MULTI_GPU\nnum_processes: 2\nfsdp_config: {}\n");
  EXPECT_FALSE(LaunchConfig::load_yaml(dir.file("empty.yaml")).fsdp.has_value());
  // ... unless distributed_type says FSDP: then the defaults apply.
  write_file(dir.file("defaults.yaml"), "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n");
  const LaunchConfig defaults = LaunchConfig::load_yaml(dir.file("defaults.yaml"));
  ASSERT_TRUE(defaults.fsdp.has_value());
  EXPECT_EQ(defaults.fsdp->sharding_strategy, ShardingStrategy::FULL_SHARD);
  // distributed_type may be left out: fsdp_config alone turns sharding on.
  write_file(dir.file("bare.yaml"), "num_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n");
  EXPECT_EQ(LaunchConfig::load_yaml(dir.file("bare.yaml")).fsdp->sharding_strategy, ShardingStrategy::NO_SHARD);
}

TEST(LaunchConfig, BadFsdpConfigValuesNameKeyAndValue) {
  // Accelerate writes strategies as numbers (1 = FULL_SHARD), which clash with ZeRO stages.
  expect_load_error("fsdp_config:\n  fsdp_sharding_strategy: 1\n",
                    {"fsdp_config.fsdp_sharding_strategy", "'1'", "give the name, not a number",
                     "stage 1 = SHARD_OPTIMIZER"});
  expect_load_error("fsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n",
                    {"fsdp_config.fsdp_sharding_strategy", "'HYBRID_SHARD'", "FULL_SHARD, SHARD_GRAD_OP"});
  expect_load_error("fsdp_config:\n  fsdp_use_orig_params: true\n",
                    {"unknown key 'fsdp_config.fsdp_use_orig_params'", "known keys", "fsdp_sharding_strategy",
                     "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params",
                     "fsdp_reshard_after_forward", "fsdp_forward_prefetch", "fsdp_backward_prefetch",
                     "fsdp_activation_checkpointing", "fsdp_state_dict_type", "fsdp_reduce_dtype",
                     "fsdp_param_dtype"});
  expect_load_error("fsdp_config:\n  fsdp_auto_wrap_policy: BY_TYPE\n",
                    {"fsdp_config.fsdp_auto_wrap_policy", "'BY_TYPE'", "TRANSFORMER_BASED_WRAP"});
  expect_load_error("fsdp_config:\n  fsdp_min_num_params: lots\n", {"fsdp_config.fsdp_min_num_params", "'lots'"});
  expect_load_error("fsdp_config:\n  fsdp_forward_prefetch: maybe\n",
                    {"fsdp_config.fsdp_forward_prefetch", "'maybe'", "true, false"});
  expect_load_error("fsdp_config:\n  fsdp_backward_prefetch: BACKWARD_POST\n",
                    {"fsdp_config.fsdp_backward_prefetch", "'BACKWARD_POST'", "BACKWARD_PRE, NO_PREFETCH"});
  expect_load_error("fsdp_config:\n  fsdp_state_dict_type: LOCAL_STATE_DICT\n",
                    {"fsdp_config.fsdp_state_dict_type", "'LOCAL_STATE_DICT'", "FULL_STATE_DICT"});
  expect_load_error("fsdp_config:\n  fsdp_reduce_dtype: fp8\n", {"fsdp_config.fsdp_reduce_dtype", "'fp8'", "f32, bf16, f16"});
  expect_load_error("fsdp_config:\n  fsdp_offload_params: true\n", {"fsdp_config.fsdp_offload_params", "not supported"});
  expect_load_error("fsdp_config:\n  fsdp_sharding_strategy: [FULL_SHARD]\n",
                    {"fsdp_config.fsdp_sharding_strategy", "string", "a list"});
  expect_load_error("fsdp_config: FULL_SHARD\n", {"fsdp_config", "mapping", "'FULL_SHARD'"});
  expect_load_error("distributed_type: NO\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n",
                    {"distributed_type", "NO", "contradicts the fsdp_config"});
  // Options set in code are checked before they are written.
  LaunchConfig c;
  c.fsdp = FSDPOptions{.min_num_params = -1};
  EXPECT_EMBER_ERROR(c.validate("command line"), "command line", "fsdp_min_num_params", "'-1'");
}

TEST(LaunchConfig, UnreadableFilesAreReported) {
  TempDir dir("ember_launch_config");
  EXPECT_EMBER_ERROR(LaunchConfig::load_yaml(dir.file("missing.yaml")), "missing.yaml", "cannot open");
  expect_load_error("num_processes: [1, 2\n", {"syntax error", "line"});
  expect_load_error("- 1\n- 2\n", {"mapping", "a list"});
  expect_load_error("just text\n", {"mapping", "'just text'"});
}

TEST(LaunchConfig, ValidateNamesItsSource) {
  LaunchConfig c;
  c.mixed_precision = "int8";
  EXPECT_EMBER_ERROR(c.validate("command line"), "command line", "mixed_precision", "'int8'");
  c = LaunchConfig{};
  c.num_machines = 3;
  c.machine_rank = 5;
  c.num_processes = 3;
  EXPECT_EMBER_ERROR(c.validate("here"), "here", "machine_rank", "5", "num_machines (3)");
}

TEST(LaunchConfig, DefaultPathFollowsTheEnvironment) {
  {
    ScopedEnv file("EMBER_CONFIG_FILE", "/some/where/ember.yaml");
    ScopedEnv xdg("XDG_CONFIG_HOME", "/xdg");
    EXPECT_EQ(default_config_path(), "/some/where/ember.yaml");
  }
  {
    ScopedEnv file("EMBER_CONFIG_FILE", std::nullopt);
    ScopedEnv xdg("XDG_CONFIG_HOME", "/xdg");
    EXPECT_EQ(default_config_path(), "/xdg/ember/default_config.yaml");
  }
  {
    ScopedEnv file("EMBER_CONFIG_FILE", "");
    ScopedEnv xdg("XDG_CONFIG_HOME", "");
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(default_config_path(), "/home/someone/.config/ember/default_config.yaml");
  }
}

TEST(LaunchConfig, LoadDefaultConfigReadsThePathWhenPresent) {
  TempDir dir("ember_launch_config");
  ScopedEnv file("EMBER_CONFIG_FILE", std::nullopt);
  ScopedEnv xdg("XDG_CONFIG_HOME", dir.path());
  EXPECT_FALSE(load_default_config().has_value());
  LaunchConfig c;
  c.num_processes = 5;
  c.save_yaml(dir.file("ember/default_config.yaml"));
  const auto loaded = load_default_config();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->num_processes, 5);
  write_file(dir.file("ember/default_config.yaml"), "num_processes: nope\n");
  EXPECT_EMBER_ERROR(load_default_config(), "default_config.yaml", "num_processes", "'nope'");
}

std::map<std::string, std::string> as_map(const std::vector<std::pair<std::string, std::string>>& env) {
  return {env.begin(), env.end()};
}

TEST(LaunchConfig, RankEnvironmentOffsetsByMachine) {
  LaunchConfig c;
  c.num_processes = 8;
  c.num_machines = 2;
  c.machine_rank = 1;
  c.main_process_ip = "10.1.1.1";
  c.main_process_port = 4000;
  c.mixed_precision = "bf16";
  c.gradient_accumulation_steps = 2;
  c.num_cpu_threads_per_process = 3;
  c.use_cpu = true;
  auto env = as_map(rank_environment(c, 2));
  EXPECT_EQ(env["RANK"], "6");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "10.1.1.1");
  EXPECT_EQ(env["MASTER_PORT"], "4000");
  EXPECT_EQ(env["EMBER_MIXED_PRECISION"], "bf16");
  EXPECT_EQ(env["EMBER_GRADIENT_ACCUMULATION_STEPS"], "2");
  EXPECT_EQ(env["EMBER_USE_CPU"], "1");
  EXPECT_EQ(env["EMBER_NUM_THREADS"], "3");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "3");
  // Sharding is stated either way, so the launcher's own environment decides nothing.
  EXPECT_EQ(env["EMBER_USE_FSDP"], "false");
  EXPECT_EQ(env.count("EMBER_FSDP_SHARDING_STRATEGY"), 0u);
  c.fsdp = FSDPOptions{.sharding_strategy = ShardingStrategy::SHARD_GRAD_OP};
  env = as_map(rank_environment(c, 0));
  EXPECT_EQ(env["EMBER_USE_FSDP"], "true");
  EXPECT_EQ(env["EMBER_FSDP_SHARDING_STRATEGY"], "SHARD_GRAD_OP");
}

TEST(LaunchConfig, ThreadsDefaultToCoresPerLocalRank) {
  LaunchConfig c;
  c.num_processes = 4;
  c.num_machines = 2;
  EXPECT_EQ(threads_per_process(c), std::max(1, available_cpus() / 2));
  c.num_processes = 2 * 4096;
  EXPECT_EQ(threads_per_process(c), 1);
  c.num_cpu_threads_per_process = 7;
  EXPECT_EQ(threads_per_process(c), 7);
  EXPECT_GE(available_cpus(), 1);
}

}  // namespace
}  // namespace ember::distributed
