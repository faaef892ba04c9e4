// ProgressBar with a scripted clock, environment and output: the exact lines each mode writes,
// when it writes them, and which mode the rank, the options, EMBER_PROGRESS and the terminal
// select.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "test_util.h"
#include "tracking/progress.h"

namespace ember {
namespace {

// A clock the test moves, an environment the test fills, and everything written.
struct FakeWorld {
  double clock = 100.0;
  std::map<std::string, std::string> env;
  std::vector<std::string> writes;
  std::vector<std::string> printed;

  ProgressOptions options(ProgressMode mode, const std::string& unit = "step") {
    ProgressOptions o;
    o.unit = unit;
    o.mode = mode;
    o.io.write = [this](const std::string& text) { writes.push_back(text); };
    o.io.print = [this](const std::string& text) { printed.push_back(text); };
    o.io.now_seconds = [this] { return clock; };
    o.io.getenv = [this](const std::string& name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    o.io.terminal = false;
    return o;
  }
};

TEST(ProgressFormat, Durations) {
  EXPECT_EQ(format_duration(0), "00:00");
  EXPECT_EQ(format_duration(59.4), "00:59");
  EXPECT_EQ(format_duration(59.6), "01:00");
  EXPECT_EQ(format_duration(307), "05:07");
  EXPECT_EQ(format_duration(3599), "59:59");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(100 * 3600 + 1), "100:00:01");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(1e12), "?");
}

TEST(ProgressFormat, Rates) {
  EXPECT_EQ(format_rate(3.4149, "step"), "3.41 step/s");
  EXPECT_EQ(format_rate(12.34, "batch"), "12.3 batch/s");
  EXPECT_EQ(format_rate(250.4, "case"), "250 case/s");
  EXPECT_EQ(format_rate(1.0, "step"), "1.00 step/s");
  // Below one per second: the seconds one takes.
  EXPECT_EQ(format_rate(0.08, "step"), "12.5 s/step");
  EXPECT_EQ(format_rate(1.0 / 250, "epoch"), "250 s/epoch");
  EXPECT_EQ(format_rate(0, "step"), "? step/s");
}

TEST(ProgressLines, PeriodicLinesAndAFinalLine) {
  FakeWorld w;
  auto options = w.options(ProgressMode::Lines);
  options.line_interval_s = 10;
  {
    ProgressBar bar("train", 100, options);
    w.clock += 4;
    bar.update(10, "loss 2.50");
    EXPECT_TRUE(w.writes.empty()) << "a line before the interval has passed";
    w.clock += 6;  // 10 s in, 20 steps: 2 steps/s, 80 left -> 40 s
    bar.update(20, "loss 2.25");
    ASSERT_EQ(w.writes.size(), 1u);
    EXPECT_EQ(w.writes[0], "train 20/100 step 20% 2.00 step/s elapsed 00:10 eta 00:40 | loss 2.25\n");
    w.clock += 9;
    bar.update(50);
    EXPECT_EQ(w.writes.size(), 1u);
    w.clock += 1;  // 20 s, 60 steps: 3 steps/s, 40 left
    bar.update(60);
    ASSERT_EQ(w.writes.size(), 2u);
    EXPECT_EQ(w.writes[1], "train 60/100 step 60% 3.00 step/s elapsed 00:20 eta 00:13\n");
    w.clock += 30;
    bar.update(100, "loss 1.75");  // the last step is left to the final line
    EXPECT_EQ(w.writes.size(), 2u);
  }  // the destructor finishes
  ASSERT_EQ(w.writes.size(), 3u);
  EXPECT_EQ(w.writes[2], "train 100/100 step 100% 2.00 step/s elapsed 00:50 eta 00:00 | loss 1.75\n");
}

TEST(ProgressLines, FinishOnceWithItsOwnPostfix) {
  FakeWorld w;
  ProgressBar bar("eval", 8, w.options(ProgressMode::Lines, "batch"));
  w.clock += 2;
  bar.update(3, "acc 0.5");
  bar.finish("acc 0.75");
  bar.finish("ignored");
  bar.update(8, "ignored");
  ASSERT_EQ(w.writes.size(), 1u);
  // Stopped early: the line says where, with nothing left to wait for.
  EXPECT_EQ(w.writes[0], "eval 3/8 batch 37% 1.50 batch/s elapsed 00:02 eta 00:00 | acc 0.75\n");
}

TEST(ProgressLines, UnknownTotalHasNoPercentageOrEta) {
  FakeWorld w;
  auto options = w.options(ProgressMode::Lines, "batch");
  options.line_interval_s = 1;
  ProgressBar bar("stream", 0, options);
  w.clock += 4;
  bar.update(1000, "tok/s 5000");
  bar.finish();
  ASSERT_EQ(w.writes.size(), 2u);
  EXPECT_EQ(w.writes[0], "stream 1000 batch 250 batch/s elapsed 00:04 | tok/s 5000\n");
  EXPECT_EQ(w.writes[1], w.writes[0]);
}

TEST(ProgressLines, SlowStepsAndAnUnknownEta) {
  FakeWorld w;
  auto options = w.options(ProgressMode::Lines, "epoch");
  options.line_interval_s = 60;
  ProgressBar bar("fit", 3, options);
  w.clock += 60;
  bar.update(0);  // no step done yet: neither rate nor ETA is known
  w.clock += 90;
  bar.update(1);
  ASSERT_EQ(w.writes.size(), 2u);
  EXPECT_EQ(w.writes[0], "fit 0/3 epoch 0% ? epoch/s elapsed 01:00 eta ?\n");
  EXPECT_EQ(w.writes[1], "fit 1/3 epoch 33% 150 s/epoch elapsed 02:30 eta 05:00\n");
  bar.finish();
}

TEST(ProgressBarMode, RedrawsInPlaceAndEndsWithANewline) {
  FakeWorld w;
  auto options = w.options(ProgressMode::Bar);
  options.redraw_interval_s = 0.1;
  ProgressBar bar("pretrain", 4, options);
  w.clock += 0.05;
  bar.update(1);
  EXPECT_TRUE(w.writes.empty()) << "redrawn more often than the interval";
  w.clock += 0.95;  // 1 s, 2 steps
  bar.update(2, "loss 3.00");
  w.clock += 1;
  bar.update(4);
  bar.finish();
  ASSERT_EQ(w.writes.size(), 2u);
  EXPECT_EQ(w.writes[0], "\r\033[Kpretrain [############............] 2/4 step 50% 2.00 step/s elapsed 00:01 eta 00:01 | loss 3.00");
  EXPECT_EQ(w.writes[1], "\r\033[Kpretrain [########################] 4/4 step 100% 2.00 step/s elapsed 00:02 eta 00:00\n");
}

TEST(ProgressBarMode, PrintedLinesGoAboveTheBar) {
  FakeWorld w;
  ProgressBar bar("fit", 10, w.options(ProgressMode::Bar));
  bar.print("before any bar");
  EXPECT_TRUE(w.writes.empty()) << "nothing to erase yet";
  w.clock += 1;
  bar.update(5);
  ASSERT_EQ(w.writes.size(), 1u);
  const std::string shown = "fit [############............] 5/10 step 50% 5.00 step/s elapsed 00:01 eta 00:01";
  EXPECT_EQ(w.writes[0], "\r\033[K" + shown);
  bar.print("step 5: loss 0.5");
  ASSERT_EQ(w.writes.size(), 3u);
  EXPECT_EQ(w.writes[1], "\r\033[K");
  EXPECT_EQ(w.writes[2], "\r\033[K" + shown);
  EXPECT_EQ(w.printed, (std::vector<std::string>{"before any bar\n", "step 5: loss 0.5\n"}));
  bar.finish();
  bar.print("after");
  EXPECT_EQ(w.writes.size(), 4u) << "a finished bar is a plain line: nothing to erase";
  EXPECT_EQ(w.printed.back(), "after\n");
}

TEST(ProgressLines, PrintedLinesAreJustLines) {
  FakeWorld w;
  ProgressBar bar("fit", 10, w.options(ProgressMode::Lines));
  w.clock += 20;
  bar.update(5);
  bar.print("report");
  EXPECT_EQ(w.writes.size(), 1u);
  EXPECT_EQ(w.printed, std::vector<std::string>{"report\n"});
}

TEST(ProgressBarMode, OffWritesNothingButStillTimes) {
  FakeWorld w;
  ProgressBar bar("quiet", 10, w.options(ProgressMode::Off));
  w.clock += 12.5;
  bar.update(5);
  bar.finish();
  EXPECT_TRUE(w.writes.empty());
  EXPECT_DOUBLE_EQ(bar.elapsed_seconds(), 12.5);
}

// --- mode selection ---------------------------------------------------------------------

ProgressMode resolve(FakeWorld& w, ProgressMode requested, bool terminal, bool all_ranks = false) {
  auto options = w.options(requested);
  options.io.terminal = terminal;
  options.all_ranks = all_ranks;
  return resolve_progress_mode(options);
}

TEST(ProgressModeSelection, TerminalDecidesWhenNothingElseDoes) {
  FakeWorld w;
  EXPECT_EQ(resolve(w, ProgressMode::Auto, true), ProgressMode::Bar);
  EXPECT_EQ(resolve(w, ProgressMode::Auto, false), ProgressMode::Lines);
  w.env["EMBER_PROGRESS"] = "auto";
  EXPECT_EQ(resolve(w, ProgressMode::Auto, false), ProgressMode::Lines);
  w.env["EMBER_PROGRESS"] = "";
  EXPECT_EQ(resolve(w, ProgressMode::Auto, true), ProgressMode::Bar);
  w.env["LOCAL_RANK"] = "0";
  EXPECT_EQ(resolve(w, ProgressMode::Auto, true), ProgressMode::Bar);
}

TEST(ProgressModeSelection, EnvironmentOverridesTheTerminal) {
  FakeWorld w;
  for (bool terminal : {false, true}) {
    SCOPED_TRACE(terminal ? "terminal" : "pipe");
    w.env["EMBER_PROGRESS"] = "lines";
    EXPECT_EQ(resolve(w, ProgressMode::Auto, terminal), ProgressMode::Lines);
    w.env["EMBER_PROGRESS"] = "off";
    EXPECT_EQ(resolve(w, ProgressMode::Auto, terminal), ProgressMode::Off);
    w.env["EMBER_PROGRESS"] = "bar";
    EXPECT_EQ(resolve(w, ProgressMode::Auto, terminal), ProgressMode::Bar);
    // What `ember launch` says when its stderr is a terminal.
    w.env["EMBER_PROGRESS"] = "tty";
    EXPECT_EQ(resolve(w, ProgressMode::Auto, terminal), ProgressMode::Bar);
  }
}

TEST(ProgressModeSelection, OptionsOverrideTheEnvironment) {
  FakeWorld w;
  w.env["EMBER_PROGRESS"] = "off";
  EXPECT_EQ(resolve(w, ProgressMode::Lines, true), ProgressMode::Lines);
  w.env["EMBER_PROGRESS"] = "bar";
  EXPECT_EQ(resolve(w, ProgressMode::Off, true), ProgressMode::Off);
}

TEST(ProgressModeSelection, OnlyLocalRankZeroDraws) {
  FakeWorld w;
  w.env["EMBER_PROGRESS"] = "tty";
  for (const char* rank : {"1", "3", "12"}) {
    w.env["LOCAL_RANK"] = rank;
    EXPECT_EQ(resolve(w, ProgressMode::Auto, true), ProgressMode::Off) << rank;
    EXPECT_EQ(resolve(w, ProgressMode::Bar, true), ProgressMode::Off) << rank;
    EXPECT_EQ(resolve(w, ProgressMode::Auto, true, /*all_ranks=*/true), ProgressMode::Bar) << rank;
    EXPECT_EQ(resolve(w, ProgressMode::Lines, true, /*all_ranks=*/true), ProgressMode::Lines) << rank;
  }
  // The global rank does not matter: rank 4 of a second machine is its local rank 0.
  w.env["LOCAL_RANK"] = "0";
  w.env["RANK"] = "4";
  EXPECT_EQ(resolve(w, ProgressMode::Auto, false), ProgressMode::Bar);

  w.env["LOCAL_RANK"] = "1";
  std::vector<std::string> writes_before = w.writes;
  {
    ProgressBar bar("rank1", 2, w.options(ProgressMode::Lines));
    EXPECT_EQ(bar.mode(), ProgressMode::Off);
    w.clock += 100;
    bar.update(1);
  }
  EXPECT_EQ(w.writes, writes_before);
}

TEST(ProgressModeSelection, UnknownEnvironmentValueIsAnError) {
  FakeWorld w;
  w.env["EMBER_PROGRESS"] = "fancy";
  EXPECT_EMBER_ERROR(resolve(w, ProgressMode::Auto, true), "EMBER_PROGRESS='fancy'", "auto, bar, tty, lines, off");
  // A rank that draws nothing never reads it.
  w.env["LOCAL_RANK"] = "1";
  EXPECT_EQ(resolve(w, ProgressMode::Auto, true), ProgressMode::Off);
}

}  // namespace
}  // namespace ember
