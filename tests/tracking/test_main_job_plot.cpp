// The main job's run can be plotted: examples/bert_sst2 on its smallest budget logs through the
// experiment trackers (config.json, metrics.jsonl, TensorBoard events), `ember plot` draws the
// pretraining loss, the fine-tuning loss and the dev accuracy from it, and a later
// --stage finetune run appends to the same file. Also the trackers' entry point for programs
// without an Accelerator (TrackerGroup::start_in) on its own.
//
// The path of the main job's binary comes from examples/CMakeLists.txt (EMBER_MAIN_JOB), which
// also makes this suite depend on it; a build without the examples has no main job to run.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "process_test_util.h"
#include "test_util.h"
#include "tracking/plot/html_report.h"
#include "tracking/plot/run_metrics.h"
#include "tracking/tracker_group.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using ember::testing::TempDir;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<int64_t> steps_of(const plot::RunMetrics& run, const std::string& metric) {
  const plot::MetricSeries* series = run.find(metric);
  return series ? series->steps : std::vector<int64_t>{};
}

#ifdef EMBER_MAIN_JOB

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct CommandResult {
  int status = -1;
  std::string out, err;
};

// Runs `program args` with its output captured in files of `dir`, killed after `seconds`.
CommandResult run(const TempDir& dir, const std::string& program, const std::string& args, int seconds) {
  const std::string command = "timeout " + std::to_string(seconds) + " '" + program + "' " + args + " >'" +
                              dir.file("stdout") + "' 2>'" + dir.file("stderr") + "' </dev/null";
  const int raw = std::system(command.c_str());
  CommandResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_text(dir.file("stdout"));
  r.err = read_text(dir.file("stderr"));
  return r;
}

// The number of points a report draws for `run` in the chart of `metric`: the vertices of its
// polylines plus its lone dots; -1 when the page has no such chart.
int drawn_points(const std::string& html, const std::string& metric, const std::string& run) {
  const size_t chart = html.find("data-metric=\"" + metric + "\"");
  if (chart == std::string::npos) return -1;
  const std::string svg = html.substr(chart, html.find("</svg>", chart) - chart);
  const size_t group = svg.find("<g class=\"series\" data-run=\"" + run + "\">");
  if (group == std::string::npos) return 0;
  const std::string body = svg.substr(group, svg.find("</g>", group) - group);
  int points = 0;
  const std::regex polyline("<polyline[^>]*points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), polyline); it != std::sregex_iterator(); ++it) {
    std::istringstream pairs((*it)[1].str());
    for (std::string pair; pairs >> pair;) ++points;
  }
  const std::regex dot("<circle class=\"point\"");
  points += int(std::distance(std::sregex_iterator(body.begin(), body.end(), dot), std::sregex_iterator()));
  return points;
}

// Every row is one JSON object (so no bare NaN or Infinity) with an integer step and a wall
// time inside [not_before, not_after]; returns the rows.
std::vector<nlohmann::json> check_rows(const std::string& metrics_file, double not_before, double not_after) {
  std::vector<nlohmann::json> rows;
  for (const std::string& line : lines_of(metrics_file)) {
    SCOPED_TRACE(line);
    EXPECT_EQ(line.find("NaN"), std::string::npos);
    EXPECT_EQ(line.find("Infinity"), std::string::npos);
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      ADD_FAILURE() << "not JSON: " << e.what();
      continue;
    }
    EXPECT_TRUE(row.is_object());
    EXPECT_TRUE(row.contains("step") && row["step"].is_number_integer());
    EXPECT_TRUE(row.contains("wall_time") && row["wall_time"].is_number());
    if (row.contains("wall_time") && row["wall_time"].is_number()) {
      EXPECT_GE(row["wall_time"].get<double>(), not_before - 1);
      EXPECT_LE(row["wall_time"].get<double>(), not_after + 1);
    }
    for (const auto& [key, value] : row.items()) EXPECT_TRUE(value.is_number() || value.is_null()) << key;
    rows.push_back(row);
  }
  return rows;
}

// The smallest budget that goes through every stage (pretrain, save, reload, fine-tune,
// evaluate): 3 pretraining steps, then 2 epochs of 2 batches over 64 phrases, evaluated on 64
// dev sentences, every step logged.
const char* kTinyBudget =
    "--pretrain-steps 3 --pretrain-batch 4 --seq-len 32 --epochs 2 --train-limit 64 --batch 32 --eval-limit 64 "
    "--log-every 1 --threads 1 --workers 0";

TEST(MainJobPlot, TheRunIsLoggedByTheTrackersAndEmberPlotDrawsEveryStage) {
  TempDir dir("main_job_plot");
  const std::string out = dir.file("bert_sst2");
  const double started = now_seconds();
  CommandResult job = run(dir, EMBER_MAIN_JOB, std::string(kTinyBudget) + " --out '" + out + "'", 120);
  const double ended = now_seconds();
  ASSERT_EQ(job.status, 0) << job.out << job.err;
  // The console output is the job's usual one.
  EXPECT_NE(job.out.find("pretrain: final loss (EMA)"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("finetune: 64 training phrases, 64 dev sentences"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("epoch 2: train loss (EMA)"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("final: SST-2 dev accuracy"), std::string::npos) << job.out;

  // The tracker's files: the options, the rows, a TensorBoard event file, the report.
  const nlohmann::json config = nlohmann::json::parse(read_text(out + "/config.json"));
  EXPECT_EQ(config["stage"], "all");
  EXPECT_EQ(config["pretrain_steps"], 3);
  EXPECT_EQ(config["epochs"], 2);
  EXPECT_EQ(config["train_limit"], 64);
  EXPECT_EQ(config["eval_limit"], 64);
  EXPECT_EQ(config["threads"], 1);
  bool has_events = false;
  for (const auto& entry : fs::directory_iterator(out))
    has_events |= entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_TRUE(has_events);
  EXPECT_TRUE(fs::exists(out + "/report.html"));

  // 3 pretraining rows, 4 fine-tuning rows and a dev accuracy after each of the 2 epochs.
  const std::vector<nlohmann::json> rows = check_rows(out + "/metrics.jsonl", started, ended);
  EXPECT_EQ(rows.size(), 3u + 4u + 2u);

  // `ember plot` reads it, and draws the three series with one point per row logged.
  const std::string cli = ember::testing::env_or("EMBER_CLI", EMBER_CLI);
  CommandResult plotted = run(dir, cli, "plot '" + out + "'", 60);
  ASSERT_EQ(plotted.status, 0) << plotted.err;
  EXPECT_EQ(plotted.out, out + "/report.html\n");
  EXPECT_EQ(plotted.err, "");  // no warnings: no line skipped
  const std::string html = read_text(out + "/report.html");
  EXPECT_EQ(drawn_points(html, "pretrain/loss", "bert_sst2"), 3);
  EXPECT_EQ(drawn_points(html, "finetune/loss", "bert_sst2"), 4);
  EXPECT_EQ(drawn_points(html, "finetune/dev_accuracy", "bert_sst2"), 2);
  EXPECT_NE(html.find("<th>pretrain_steps</th>"), std::string::npos);  // config.json's table

  const plot::RunMetrics run_metrics = plot::read_run(out);
  EXPECT_EQ(steps_of(run_metrics, "pretrain/loss"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(steps_of(run_metrics, "finetune/loss"), (std::vector<int64_t>{1, 2, 3, 4}));
  // Each epoch's accuracy sits at the fine-tuning step that ends it.
  EXPECT_EQ(steps_of(run_metrics, "finetune/dev_accuracy"), (std::vector<int64_t>{2, 4}));
  for (const double accuracy : run_metrics.find("finetune/dev_accuracy")->values) {
    EXPECT_GE(accuracy, 0.0);
    EXPECT_LE(accuracy, 1.0);
  }
  // The page is exactly what the plot library draws from those rows.
  EXPECT_EQ(html, plot::render_html_report({run_metrics}));

  // Fine-tuning again from the saved checkpoint appends to the run: its rows replace the
  // earlier ones at the same steps, the pretraining curve stays.
  const size_t rows_before = rows.size();
  const double resumed = now_seconds();
  job = run(dir, EMBER_MAIN_JOB,
            "--stage finetune --epochs 1 --train-limit 64 --batch 32 --eval-limit 64 --log-every 1 --threads 1 "
            "--workers 0 --out '" +
                out + "'",
            120);
  ASSERT_EQ(job.status, 0) << job.out << job.err;
  EXPECT_NE(job.out.find("finetune: starting from " + out + "/pretrained"), std::string::npos) << job.out;
  const std::vector<nlohmann::json> all_rows = check_rows(out + "/metrics.jsonl", started, now_seconds());
  ASSERT_EQ(all_rows.size(), rows_before + 2u + 1u);
  for (size_t i = rows_before; i < all_rows.size(); ++i) EXPECT_GE(all_rows[i]["wall_time"].get<double>(), resumed - 1);
  EXPECT_EQ(nlohmann::json::parse(read_text(out + "/config.json"))["stage"], "finetune");
  const plot::RunMetrics appended = plot::read_run(out);
  EXPECT_EQ(steps_of(appended, "pretrain/loss"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(steps_of(appended, "finetune/loss"), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(steps_of(appended, "finetune/dev_accuracy"), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(appended.find("finetune/dev_accuracy")->values[0], all_rows.back()["finetune/dev_accuracy"].get<double>());
  // The job rewrote its report at the end; it shows the appended rows.
  EXPECT_EQ(read_text(out + "/report.html"), plot::render_html_report({appended}));
}

TEST(MainJobPlot, RefusesABadLogIntervalAndAMetricsFileItCannotAppendTo) {
  TempDir dir("main_job_plot_args");
  CommandResult job = run(dir, EMBER_MAIN_JOB, "--log-every 0 --out '" + dir.file("run") + "'", 30);
  EXPECT_EQ(job.status, 1);
  EXPECT_NE(job.err.find("--log-every must be at least 1, got 0"), std::string::npos) << job.err;
  EXPECT_FALSE(fs::exists(dir.file("run")));

  // Rows in a format of its own (no wall_time): refused before any training, file untouched.
  const std::string old_rows = "{\"stage\": \"pretrain\", \"step\": 50, \"loss\": 7.1}\n";
  fs::create_directories(dir.file("old"));
  dir.write("old/metrics.jsonl", old_rows);
  job = run(dir, EMBER_MAIN_JOB, "--out '" + dir.file("old") + "'", 30);
  EXPECT_EQ(job.status, 1);
  EXPECT_NE(job.err.find("bert_sst2: cannot append to " + dir.file("old") + "/metrics.jsonl"), std::string::npos)
      << job.err;
  EXPECT_NE(job.err.find("metrics.jsonl:1: \"wall_time\" must be a number"), std::string::npos) << job.err;
  EXPECT_NE(job.err.find("move it away or choose another --out"), std::string::npos) << job.err;
  EXPECT_EQ(job.out.find("pretrain:"), std::string::npos) << job.out;
  EXPECT_EQ(read_text(dir.file("old/metrics.jsonl")), old_rows);
  EXPECT_FALSE(fs::exists(dir.file("old/config.json")));
}

#else

TEST(MainJobPlot, TheRunIsLoggedByTheTrackersAndEmberPlotDrawsEveryStage) {
  GTEST_SKIP() << "built without the examples (EMBER_BUILD_EXAMPLES=OFF): there is no main job to run";
}

#endif

// ---- the trackers without an Accelerator

TEST(TrackerGroupStartIn, WritesTheRunDirectoryItIsGiven) {
  TempDir dir("tracker_start_in");
  const std::string run_dir = dir.file("runs/job");
  tracking::TrackerGroup trackers({"jsonl", "tensorboard"});
  trackers.start_in(run_dir, {{"lr", 1e-3}, {"stage", "all"}});
  EXPECT_EQ(trackers.run_dir(), run_dir);
  ASSERT_NE(trackers.get("jsonl"), nullptr);
  EXPECT_EQ(trackers.get("jsonl")->path(), run_dir + "/metrics.jsonl");
  EXPECT_EMBER_ERROR(trackers.start_in(dir.file("other"), {}), "still active", run_dir);
  trackers.log({{"a/loss", 2.5}, {"a/nan", std::nan("")}}, 7);
  trackers.log({{"b/accuracy", 0.5}}, 3);
  trackers.finish();
  EXPECT_EQ(nlohmann::json::parse(read_text(run_dir + "/config.json")), nlohmann::json({{"lr", 1e-3}, {"stage", "all"}}));
  const std::vector<std::string> lines = lines_of(run_dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["step"], 7);
  EXPECT_TRUE(nlohmann::json::parse(lines[0])["a/nan"].is_null());
  const plot::RunMetrics run_metrics = plot::read_run(run_dir);
  EXPECT_EQ(steps_of(run_metrics, "b/accuracy"), (std::vector<int64_t>{3}));

  // A second run in the same directory appends; without write=true nothing is written.
  trackers.start_in(run_dir, {{"lr", 2e-3}});
  trackers.log({{"a/loss", 1.5}}, 8);
  trackers.finish();
  EXPECT_EQ(lines_of(run_dir + "/metrics.jsonl").size(), 3u);
  trackers.start_in(dir.file("not_written"), {}, /*write=*/false);
  trackers.log({{"a/loss", 1.0}}, 9);
  trackers.finish();
  EXPECT_FALSE(fs::exists(dir.file("not_written")));

  // A killed run's cut-off last line is dropped before the next run appends, so the file
  // stays one row per line.
  {
    std::ofstream(run_dir + "/metrics.jsonl", std::ios::app) << "{\"step\":9,\"wall_ti";
  }
  trackers.start_in(run_dir, {});
  trackers.log({{"a/loss", 0.5}}, 10);
  trackers.finish();
  const std::vector<std::string> resumed = lines_of(run_dir + "/metrics.jsonl");
  ASSERT_EQ(resumed.size(), 4u);
  EXPECT_EQ(nlohmann::json::parse(resumed[3])["step"], 10);
  const plot::RunMetrics after_kill = plot::read_run(run_dir);
  EXPECT_TRUE(after_kill.warnings.empty());
  EXPECT_EQ(steps_of(after_kill, "a/loss"), (std::vector<int64_t>{7, 8, 10}));

  EXPECT_EMBER_ERROR(trackers.start_in("", {}), "run directory is empty");
  const std::string blocker = dir.write("blocker", "x");
  EXPECT_EMBER_ERROR(trackers.start_in(blocker + "/run", {}), "cannot create the run directory", "blocker");
}

}  // namespace
}  // namespace ember
