// examples/gpt_text on a tiny budget: a one-layer model trained for 30 steps must already beat
// the uniform byte model by far (validation perplexity well below 257), print its samples, log
// its run and save a model from_pretrained reads back; the same binary, unchanged, completes
// under `ember launch --num_processes 2`; bad options are clear errors.
//
// The binary's path comes from examples/CMakeLists.txt (EMBER_GPT_TEXT), which also makes this
// suite depend on it; a build without the examples has nothing to run.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "nn/models/gpt2.h"
#include "process_test_util.h"
#include "test_util.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using ember::testing::TempDir;

#ifdef EMBER_GPT_TEXT

struct CommandResult {
  int status = -1;
  std::string out, err;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `command` (a shell line) with its output captured in files of `dir`, killed after `seconds`.
CommandResult run(const TempDir& dir, const std::string& command, int seconds) {
  const std::string line = "timeout " + std::to_string(seconds) + " " + command + " >'" + dir.file("stdout") + "' 2>'" +
                           dir.file("stderr") + "' </dev/null";
  const int raw = std::system(line.c_str());
  CommandResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_text(dir.file("stdout"));
  r.err = read_text(dir.file("stderr"));
  return r;
}

std::string example() { return std::string("'") + EMBER_GPT_TEXT + "'"; }

// The number after `label` in the last line that has it; NaN when there is none.
double number_after(const std::string& text, const std::string& label) {
  const std::regex pattern(label + " ([0-9.eE+-]+|nan|inf)");
  double value = std::nan("");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern); it != std::sregex_iterator(); ++it)
    value = std::stod((*it)[1].str());
  return value;
}

// The smallest run that goes through every stage: 30 steps of a 1-layer, 64-wide model on
// batches of 8, scored on the first 256 validation windows, 24 sampled bytes per prompt.
const char* kTinyRun =
    "--steps 30 --n_layer 1 --n_embd 64 --n_head 4 --batch 8 --lr 3e-3 --eval_windows 256 --sample_tokens 24 "
    "--threads 1";

TEST(GptTextExample, ThirtyStepsBeatTheUniformByteModelByFar) {
  TempDir dir("gpt_text");
  const CommandResult job = run(dir,
                                example() + " " + kTinyRun + " --project_dir '" + dir.file("runs") + "' --save '" +
                                    dir.file("model") + "'",
                                300);
  ASSERT_EQ(job.status, 0) << job.out << job.err;
  // A uniform guess over 257 ids has perplexity 257 (8.0 bits per byte); 30 steps of a tiny
  // model learn at least the byte frequencies, which alone give about 20 on English text.
  const double perplexity = number_after(job.out, "validation perplexity");
  EXPECT_LT(perplexity, 40.0) << job.out;
  EXPECT_GT(perplexity, 1.0) << job.out;
  const double bits = number_after(job.out, "perplexity [0-9.]+,");
  EXPECT_LT(bits, 6.0) << job.out;
  EXPECT_NE(job.out.find("gpt_text: trained 30 steps"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("on 1 process(es), validation perplexity"), std::string::npos) << job.out;
  for (const char* prompt : {"sample: The ", "sample: In 1914 ", "sample: She said ", "sample: It was a "})
    EXPECT_NE(job.out.find(prompt), std::string::npos) << prompt << "\n" << job.out;

  // The run's rows: the training curve every 10 steps and the validation figures at step 30.
  std::vector<nlohmann::json> rows;
  std::istringstream lines(read_text(dir.file("runs/gpt_text/metrics.jsonl")));
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[size_t(i)]["step"], 10 * (i + 1));
    EXPECT_GT(rows[size_t(i)]["tokens_per_s"].get<double>(), 0.0);
    EXPECT_GE(rows[size_t(i)]["lr"].get<double>(), 0.0);
  }
  EXPECT_LT(rows[2]["loss"].get<double>(), rows[0]["loss"].get<double>());
  EXPECT_EQ(rows[3]["step"], 30);
  EXPECT_NEAR(rows[3]["val_perplexity"].get<double>(), perplexity, 1e-3 * perplexity);
  EXPECT_TRUE(fs::exists(dir.file("runs/gpt_text/report.html")));

  // The saved model is a GPT-2 checkpoint of the byte vocabulary.
  auto model = nn::GPT2LMHeadModel::from_pretrained(dir.file("model"));
  EXPECT_EQ(model->config.vocab_size, 257);
  EXPECT_EQ(model->config.n_positions, 128);
  EXPECT_EQ(model->config.n_embd, 64);
  EXPECT_EQ(model->config.n_layer, 1);
  EXPECT_EQ(model->config.eos_token_id, 256);
}

TEST(GptTextExample, RunsUnchangedUnderTheLauncherOnTwoProcesses) {
  const std::string cli = ember::testing::env_or("EMBER_CLI", EMBER_CLI);
  if (!fs::exists(cli)) GTEST_SKIP() << "no `ember` command at " << cli;
  TempDir dir("gpt_text_launch");
  const CommandResult job =
      run(dir,
          "'" + cli + "' launch --num_processes 2 --main_process_port " + std::to_string(ember::testing::free_port()) +
              " " + example() +
              " --steps 10 --n_layer 1 --n_embd 64 --batch 8 --eval_windows 64 --sample_tokens 8 --threads 1 "
              "--project_dir '" + dir.file("runs") + "'",
          300);
  ASSERT_EQ(job.status, 0) << job.out << job.err;
  const std::string all = job.out + job.err;
  EXPECT_NE(all.find("gpt_text: done: 10 steps"), std::string::npos) << all;
  EXPECT_NE(all.find("on 2 process(es), validation perplexity"), std::string::npos) << all;
  // Printed once, by the main process.
  EXPECT_EQ(all.find("gpt_text: done:"), all.rfind("gpt_text: done:")) << all;
  EXPECT_LT(number_after(all, "validation perplexity"), 257.0) << all;
}

TEST(GptTextExample, BadOptionsAreClearErrors) {
  TempDir dir("gpt_text_args");
  CommandResult job = run(dir, example() + " --batch eight", 30);
  EXPECT_EQ(job.status, 1);
  EXPECT_NE(job.err.find("gpt_text: --batch needs an integer, got 'eight'"), std::string::npos) << job.err;
  job = run(dir, example() + " --n-embd 64 --n_head 3 --steps 1", 30);
  EXPECT_EQ(job.status, 1);
  EXPECT_NE(job.err.find("n_head"), std::string::npos) << job.err;
  job = run(dir, example() + " --schedule step", 30);
  EXPECT_EQ(job.status, 1);
  EXPECT_NE(job.err.find("--schedule must be cosine or linear, got step"), std::string::npos) << job.err;
  job = run(dir, example() + " --layers 2", 30);
  EXPECT_EQ(job.status, 1);
  EXPECT_NE(job.err.find("unknown option --layers"), std::string::npos) << job.err;
  job = run(dir, example() + " --steps 1 --data_dir '" + dir.path() + "'", 30);
  EXPECT_EQ(job.status, 1);
  EXPECT_NE(job.err.find(dir.path() + "/corpus/wikitext2_raw_test.txt.gz is missing"), std::string::npos) << job.err;
}

#else

TEST(GptTextExample, ThirtyStepsBeatTheUniformByteModelByFar) {
  GTEST_SKIP() << "built without the examples (EMBER_BUILD_EXAMPLES=OFF): there is no gpt_text to run";
}

#endif

}  // namespace
}  // namespace ember
