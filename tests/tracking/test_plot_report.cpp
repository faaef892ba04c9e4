// The training report behind `ember plot`: reading run directories (repeated steps, a cut-off
// last line, malformed lines, nulls, config.json, project directories), the axis ticks and their
// labels, the page's charts, labels and point coordinates, and the command run as a process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "process_test_util.h"
#include "test_util.h"
#include "tracking/plot/axis_ticks.h"
#include "tracking/plot/html_report.h"
#include "tracking/plot/run_metrics.h"
#include "tracking/plot/svg_chart.h"

namespace ember::plot {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ember::testing::TempDir;

RunMetrics parse(const std::string& text) {
  RunMetrics run;
  parse_metrics_jsonl(text, "runs/a/metrics.jsonl", run);
  return run;
}

std::string line(int64_t step, const std::string& values) {
  return "{\"step\":" + std::to_string(step) + ",\"wall_time\":1764561234.5" + (values.empty() ? "" : ",") + values +
         "}\n";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The texts of the elements with the given class, in document order.
std::vector<std::string> texts_of_class(const std::string& markup, const std::string& cls) {
  std::vector<std::string> out;
  const std::regex element("class=\"" + cls + "\"[^>]*>([^<]*)<");
  for (auto it = std::sregex_iterator(markup.begin(), markup.end(), element); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

// The <svg> of the chart for `metric` in a page.
std::string chart_svg(const std::string& html, const std::string& metric) {
  const size_t begin = html.find("data-metric=\"" + metric + "\"");
  if (begin == std::string::npos) return "";
  return html.substr(begin, html.find("</svg>", begin) - begin);
}

// The points of the polylines drawn for `run` in a chart, as (x, y) pairs.
std::vector<std::vector<std::pair<double, double>>> polylines_of(const std::string& svg, const std::string& run) {
  std::vector<std::vector<std::pair<double, double>>> lines;
  const size_t group = svg.find("<g class=\"series\" data-run=\"" + run + "\">");
  if (group == std::string::npos) return lines;
  const std::string body = svg.substr(group, svg.find("</g>", group) - group);
  const std::regex polyline("<polyline[^>]*points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), polyline); it != std::sregex_iterator(); ++it) {
    std::vector<std::pair<double, double>> points;
    std::istringstream in((*it)[1].str());
    std::string pair;
    while (in >> pair) {
      const size_t comma = pair.find(',');
      points.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
    }
    lines.push_back(points);
  }
  return lines;
}

// ---- reading

TEST(PlotRunMetrics, MetricsInFirstSeenOrderSortedByStep) {
  const RunMetrics run = parse(line(0, "\"loss\":2.5,\"lr\":0.0001,\"tokens_per_s\":5120.5") +
                               line(10, "\"loss\":2.25,\"lr\":0.0002,\"tokens_per_s\":5000") +
                               line(10, "\"eval_accuracy\":0.5") + line(20, "\"loss\":2,\"lr\":0.0003"));
  ASSERT_EQ(run.metrics.size(), 4u);
  EXPECT_EQ(run.metrics[0].name, "loss");
  EXPECT_EQ(run.metrics[1].name, "lr");
  EXPECT_EQ(run.metrics[2].name, "tokens_per_s");
  EXPECT_EQ(run.metrics[3].name, "eval_accuracy");
  EXPECT_THAT(run.find("loss")->steps, ElementsAre(0, 10, 20));
  EXPECT_THAT(run.find("loss")->values, ElementsAre(2.5, 2.25, 2.0));
  EXPECT_THAT(run.find("tokens_per_s")->steps, ElementsAre(0, 10));
  EXPECT_THAT(run.find("eval_accuracy")->steps, ElementsAre(10));
  EXPECT_EQ(run.find("wall_time"), nullptr);
  EXPECT_EQ(run.find("step"), nullptr);
  EXPECT_TRUE(run.warnings.empty());
}

TEST(PlotRunMetrics, RepeatedStepKeepsTheLaterLine) {
  // A run killed after step 3 and resumed from its step-1 checkpoint logs 2 and 3 again.
  const RunMetrics run = parse(line(1, "\"loss\":4") + line(2, "\"loss\":3") + line(3, "\"loss\":2.5") +
                               line(2, "\"loss\":3.5") + line(3, "\"loss\":3.25") + line(4, "\"loss\":3"));
  EXPECT_THAT(run.find("loss")->steps, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(run.find("loss")->values, ElementsAre(4.0, 3.5, 3.25, 3.0));
}

TEST(PlotRunMetrics, CutOffLastLineIsSkippedWithAWarning) {
  const std::string whole = line(0, "\"loss\":2") + line(1, "\"loss\":1.5");
  for (const char* cut : {"{\"step\":2,\"wall_time\":17645", "{\"step\":2,\"wall_time\":1.5,\"lo",
                                 "{\"step\":2,\"wall_time\":1.5,\"loss\":1.", "{\"step\":2,\"wall_time\":1.5,\"loss\":nu"}) {
    SCOPED_TRACE(cut);
    const RunMetrics run = parse(whole + cut);
    EXPECT_THAT(run.find("loss")->steps, ElementsAre(0, 1));
    ASSERT_EQ(run.warnings.size(), 1u);
    EXPECT_THAT(run.warnings[0], HasSubstr("runs/a/metrics.jsonl:3"));
    EXPECT_THAT(run.warnings[0], HasSubstr("cut short"));
  }
}

TEST(PlotRunMetrics, BadLinesNameTheFileAndLine) {
  const std::string first = line(0, "\"loss\":2");
  // A cut-off line followed by more lines is damage, not a killed run.
  EXPECT_EMBER_ERROR(parse(first + "{\"step\":1,\"wall\n" + line(2, "\"loss\":1")), "runs/a/metrics.jsonl:2",
                     "not a JSON object");
  // A complete last line that is malformed is an error too, not a cut-off one.
  EXPECT_EMBER_ERROR(parse(first + "{\"step\":1,\"wall_time\":1,\"loss\":x}"), "runs/a/metrics.jsonl:2");
  EXPECT_EMBER_ERROR(parse(first + line(1, "\"loss\":\"high\"")), "runs/a/metrics.jsonl:2",
                     "\"loss\" must be a number or null, got \"high\"");
  EXPECT_EMBER_ERROR(parse(first + first + "{\"wall_time\":1,\"loss\":1}\n"), "runs/a/metrics.jsonl:3",
                     "no \"step\"");
  EXPECT_EMBER_ERROR(parse("{\"step\":1.5,\"wall_time\":1,\"loss\":1}\n"), "runs/a/metrics.jsonl:1",
                     "\"step\" must be an integer, got 1.5");
  EXPECT_EMBER_ERROR(parse("{\"step\":1,\"loss\":1}\n"), "runs/a/metrics.jsonl:1", "\"wall_time\" must be a number");
  EXPECT_EMBER_ERROR(parse(first + "[1,2]\n"), "runs/a/metrics.jsonl:2", "expected a JSON object, got array");
  EXPECT_EMBER_ERROR(parse(first + line(1, "\"loss\":true")), "runs/a/metrics.jsonl:2", "\"loss\"");
}

TEST(PlotRunMetrics, DamagedFilesParseOrRaiseEmberErrorOnly) {
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const std::string valid = line(0, "\"loss\":2.5,\"lr\":null") + line(1, "\"loss\":1e-3,\"acc\":-0.5") +
                            line(1, "\"loss\":7");
  const std::string alphabet = "{}[]\":,.-+eE0123456789nultrfas \n\\\x80\xff";
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = valid;
    for (int edits = int(ember::testing::uniform_int(1, 4)); edits > 0; --edits) {
      const size_t at = size_t(ember::testing::uniform_int(0, int64_t(text.size()) - 1));
      const char c = alphabet[size_t(ember::testing::uniform_int(0, int64_t(alphabet.size()) - 1))];
      switch (ember::testing::uniform_int(0, 2)) {
        case 0: text[at] = c; break;
        case 1: text.insert(at, 1, c); break;
        default: text.erase(at, 1);
      }
    }
    try {
      const RunMetrics run = parse(text);
      for (const MetricSeries& s : run.metrics) {
        ASSERT_EQ(s.steps.size(), s.values.size());
        for (size_t i = 1; i < s.steps.size(); ++i) ASSERT_LT(s.steps[i - 1], s.steps[i]);
      }
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("runs/a/metrics.jsonl:")) << text;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an ember::Error: " << e.what() << " for:\n" << text;
    }
  }
}

TEST(PlotRunMetrics, NullIsNaNAndBlankLinesAreSkipped) {
  const RunMetrics run = parse(line(0, "\"loss\":2") + "\n" + line(1, "\"loss\":null") + "  \n" + line(2, "\"loss\":1"));
  EXPECT_THAT(run.find("loss")->steps, ElementsAre(0, 1, 2));
  EXPECT_EQ(run.find("loss")->values[0], 2.0);
  EXPECT_TRUE(std::isnan(run.find("loss")->values[1]));
  EXPECT_EQ(run.find("loss")->values[2], 1.0);
}

TEST(PlotRunMetrics, ReadsARunDirectoryAndItsConfig) {
  TempDir dir("plot_read");
  std::filesystem::create_directories(dir.file("bert_lr3e-5"));
  const std::string run_dir = dir.file("bert_lr3e-5");
  std::ofstream(run_dir + "/metrics.jsonl") << line(5, "\"loss\":1.25");
  std::ofstream(run_dir + "/config.json") << R"({"model":"bert-base","lr":3e-05,"batch_size":32,"fp16":true})";
  const RunMetrics run = read_run(run_dir + "/");
  EXPECT_EQ(run.name, "bert_lr3e-5");
  EXPECT_THAT(run.find("loss")->values, ElementsAre(1.25));
  ASSERT_EQ(run.config.size(), 4u);
  EXPECT_EQ(run.config[0], std::make_pair(std::string("model"), std::string("bert-base")));
  EXPECT_EQ(run.config[1].first, "lr");
  EXPECT_EQ(std::stod(run.config[1].second), 3e-5);
  EXPECT_EQ(run.config[2], std::make_pair(std::string("batch_size"), std::string("32")));
  EXPECT_EQ(run.config[3], std::make_pair(std::string("fp16"), std::string("true")));

  std::ofstream(run_dir + "/config.json") << "[1]";
  EXPECT_EMBER_ERROR(read_run(run_dir), "config.json", "expected a JSON object");
  EXPECT_EMBER_ERROR(read_run(dir.path()), dir.path(), "has no metrics.jsonl");
}

TEST(PlotRunMetrics, AProjectDirectoryMeansItsRuns) {
  TempDir dir("plot_project");
  for (const std::string run : {"seed2", "seed1", "notes"}) std::filesystem::create_directories(dir.file(run));
  std::ofstream(dir.file("seed1/metrics.jsonl")) << line(0, "\"loss\":1");
  std::ofstream(dir.file("seed2/metrics.jsonl")) << line(0, "\"loss\":2");
  EXPECT_THAT(expand_run_dirs({dir.path()}), ElementsAre(dir.file("seed1"), dir.file("seed2")));
  EXPECT_THAT(expand_run_dirs({dir.file("seed2"), dir.file("seed1")}), ElementsAre(dir.file("seed2"), dir.file("seed1")));
  EXPECT_EMBER_ERROR(expand_run_dirs({dir.file("notes")}), "notes has no metrics.jsonl, and no subdirectory");
  EXPECT_EMBER_ERROR(expand_run_dirs({dir.file("missing")}), "missing is not a directory");
  EXPECT_EMBER_ERROR(expand_run_dirs({dir.file("seed1"), dir.path()}), "seed1 is named twice");
}

TEST(PlotRunMetrics, RunsWithTheSameNameAreToldApartByTheirParent) {
  TempDir dir("plot_names");
  for (const std::string run : {"sweep_a/seed1", "sweep_b/seed1"}) {
    std::filesystem::create_directories(dir.file(run));
    std::ofstream(dir.file(run + "/metrics.jsonl")) << line(0, "\"loss\":1");
  }
  const std::vector<RunMetrics> runs = read_runs({dir.file("sweep_a/seed1"), dir.file("sweep_b/seed1")});
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, "sweep_a/seed1");
  EXPECT_EQ(runs[1].name, "sweep_b/seed1");
}

// ---- ticks

std::vector<std::string> labels(const AxisTicks& ticks) {
  std::vector<std::string> out;
  for (double v : ticks.values) out.push_back(format_tick(v, ticks));
  return out;
}

void expect_ticks(const AxisTicks& ticks, const std::vector<double>& expected) {
  ASSERT_EQ(ticks.values.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(ticks.values[i], expected[i], 1e-9 * std::max(1.0, std::fabs(expected[i]))) << "tick " << i;
  EXPECT_EQ(ticks.lo, ticks.values.front());
  EXPECT_EQ(ticks.hi, ticks.values.back());
}

TEST(PlotTicks, UnitRange) {
  const AxisTicks t = nice_ticks(0, 1);
  expect_ticks(t, {0, 0.2, 0.4, 0.6, 0.8, 1.0});
  EXPECT_THAT(labels(t), ElementsAre("0.0", "0.2", "0.4", "0.6", "0.8", "1.0"));
}

TEST(PlotTicks, LearningRateRangeIsScientific) {
  const AxisTicks t = nice_ticks(1e-5, 3e-4);
  expect_ticks(t, {0, 1e-4, 2e-4, 3e-4});
  EXPECT_THAT(labels(t), ElementsAre("0", "1e-4", "2e-4", "3e-4"));
  const AxisTicks fine = nice_ticks(2e-5, 1.7e-4);
  expect_ticks(fine, {0, 5e-5, 1e-4, 1.5e-4, 2e-4});
  EXPECT_THAT(labels(fine), ElementsAre("0", "5e-5", "1e-4", "1.5e-4", "2e-4"));
}

TEST(PlotTicks, NarrowRangeFarFromZero) {
  const AxisTicks t = nice_ticks(9990, 10010);
  expect_ticks(t, {9990, 9995, 10000, 10005, 10010});
  EXPECT_THAT(labels(t), ElementsAre("9,990", "9,995", "10,000", "10,005", "10,010"));
  const AxisTicks loss = nice_ticks(2.301, 2.3094);
  EXPECT_LE(loss.lo, 2.301);
  EXPECT_GE(loss.hi, 2.3094);
  EXPECT_EQ(labels(loss).front(), "2.300");
}

TEST(PlotTicks, LargeValuesUseSeparatorsThenScientific) {
  const AxisTicks t = nice_ticks(0, 12000);
  expect_ticks(t, {0, 5000, 10000, 15000});
  EXPECT_THAT(labels(t), ElementsAre("0", "5,000", "10,000", "15,000"));
  const AxisTicks huge = nice_ticks(1e9, 2.9e10);
  EXPECT_THAT(labels(huge), ElementsAre("0", "1e10", "2e10", "3e10"));
}

TEST(PlotTicks, OneValueSitsInsideItsAxis) {
  const AxisTicks t = nice_ticks(5, 5);
  expect_ticks(t, {4.4, 4.6, 4.8, 5.0, 5.2, 5.4, 5.6});
  EXPECT_THAT(labels(t), ElementsAre("4.4", "4.6", "4.8", "5.0", "5.2", "5.4", "5.6"));
  expect_ticks(nice_ticks(0, 0), {-1, -0.5, 0, 0.5, 1});
  EXPECT_THAT(labels(nice_ticks(-3e-4, -3e-4)), ElementsAre("-3.4e-4", "-3.2e-4", "-3e-4", "-2.8e-4", "-2.6e-4"));
}

TEST(PlotTicks, StepsKeepWholeSpacing) {
  expect_ticks(nice_ticks(0, 3, 8, true), {0, 1, 2, 3});
  expect_ticks(nice_ticks(7, 7, 8, true), {6, 7, 8});
  EXPECT_EMBER_ERROR(nice_ticks(1, std::nan("")), "not a finite interval");
}

// Values near the ends of double: the largest finite values, denormals, steps past 2^53. The
// axis must stay finite, enclose the data (or reach the largest double) and keep a few ticks.
TEST(PlotTicks, ExtremeRangesStayFiniteAndFew) {
  const std::vector<std::pair<double, double>> ranges = {
      {4.9406564584124654e-324, 4.9406564584124654e-324}, {-0.0, 1e-300}, {1.7976931348623157e308, 1.7976931348623157e308},
      {-1.7976931348623157e308, 1.7976931348623157e308}, {0, 9.223372036854775807e18},
      {9007199254740993.0, 9007199254740995.0}, {-2.5e-7, 1.7976931348623157e308}};
  for (const auto& [lo, hi] : ranges) {
    for (bool whole : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "[" << lo << ", " << hi << "] integer_spacing " << whole);
      const AxisTicks t = nice_ticks(lo, hi, 5, whole);
      ASSERT_GE(t.values.size(), 2u);
      EXPECT_LE(t.values.size(), 30u);
      for (size_t i = 0; i < t.values.size(); ++i) {
        EXPECT_TRUE(std::isfinite(t.values[i]));
        if (i > 0) {
          EXPECT_LT(t.values[i - 1], t.values[i]);
        }
        EXPECT_FALSE(format_tick(t.values[i], t).empty());
      }
      // The first tick may sit a rounding slack (1e-9 of the spacing) inside the data.
      EXPECT_LE(t.lo - lo, 1e-8 * std::fabs(t.hi));
      EXPECT_TRUE(t.hi >= hi || t.hi == DBL_MAX);
    }
  }
}

// ---- the page

// Run "a": loss 1 - step/100 on steps 0, 10, ..., 100 and lr; run "b": loss on steps 0..50 and
// an evaluation metric. Written as run directories in `dir`.
std::vector<std::string> write_two_runs(const TempDir& dir) {
  std::filesystem::create_directories(dir.file("a"));
  std::filesystem::create_directories(dir.file("b"));
  std::string a, b;
  for (int step = 0; step <= 100; step += 10)
    a += line(step, "\"loss\":" + std::to_string(1 - step / 100.0) + ",\"lr\":" + std::to_string(1e-5 * (step + 1)));
  for (int step = 0; step <= 50; step += 10) b += line(step, "\"loss\":" + std::to_string(0.9 - step / 200.0));
  b += line(50, "\"f1<macro>\":0.75");
  std::ofstream(dir.file("a/metrics.jsonl")) << a;
  std::ofstream(dir.file("b/metrics.jsonl")) << b;
  std::ofstream(dir.file("a/config.json")) << R"({"lr":0.001,"batch_size":32})";
  std::ofstream(dir.file("b/config.json")) << R"({"lr":0.002,"batch_size":32,"warmup":100})";
  return {dir.file("a"), dir.file("b")};
}

TEST(PlotReport, OneChartPerMetricWithEveryRunThatLoggedIt) {
  TempDir dir("plot_page");
  const std::string html = render_html_report(read_runs(write_two_runs(dir)));
  EXPECT_THAT(texts_of_class(html, "chart-title"), ElementsAre("loss", "lr", "f1&lt;macro&gt;"));
  EXPECT_EQ(html.find("f1<macro>"), std::string::npos);
  EXPECT_THAT(texts_of_class(chart_svg(html, "loss"), "legend-entry"), ElementsAre("a", "b"));
  EXPECT_THAT(texts_of_class(chart_svg(html, "lr"), "legend-entry"), ElementsAre("a"));
  EXPECT_THAT(texts_of_class(chart_svg(html, "f1&lt;macro&gt;"), "legend-entry"), ElementsAre("b"));
  // b's one evaluation point is a dot, not an invisible one-point line.
  EXPECT_THAT(chart_svg(html, "f1&lt;macro&gt;"), HasSubstr("<circle class=\"point\""));
  EXPECT_THAT(texts_of_class(html, "axis-label"), ::testing::Contains("step"));
  // The configs side by side; lr differs between the runs, batch_size does not.
  EXPECT_THAT(html, HasSubstr("<tr><th>lr</th><td class=\"differs\">0.001</td><td class=\"differs\">0.002</td></tr>"));
  EXPECT_THAT(html, HasSubstr("<tr><th>batch_size</th><td>32</td><td>32</td></tr>"));
  EXPECT_THAT(html, HasSubstr("<tr><th>warmup</th><td class=\"differs\">&mdash;</td><td class=\"differs\">100</td></tr>"));
}

TEST(PlotReport, SelfContained) {
  TempDir dir("plot_self");
  std::string html = render_html_report(read_runs(write_two_runs(dir)));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char* outside : {"<script", "src=", "href=", "url(", "@import", "<link", "<img"})
    EXPECT_EQ(html.find(outside), std::string::npos) << outside;
  // The only address is the SVG namespace, which is a name, never fetched.
  const std::string svg_namespace = "xmlns=\"http://www.w3.org/2000/svg\"";
  for (size_t at = html.find(svg_namespace); at != std::string::npos; at = html.find(svg_namespace))
    html.erase(at, svg_namespace.size());
  EXPECT_EQ(html.find("http"), std::string::npos);
}

TEST(PlotReport, TickLabelsAreTheDataRangesNiceNumbers) {
  TempDir dir("plot_labels");
  const std::string html = render_html_report(read_runs(write_two_runs(dir)));
  // loss spans [0, 1] over both runs; steps [0, 100].
  EXPECT_THAT(texts_of_class(chart_svg(html, "loss"), "tick-y"), ElementsAre("0.0", "0.2", "0.4", "0.6", "0.8", "1.0"));
  EXPECT_THAT(texts_of_class(chart_svg(html, "loss"), "tick-x"), ElementsAre("0", "20", "40", "60", "80", "100"));
  // lr spans [1e-5, 1.01e-3].
  EXPECT_THAT(texts_of_class(chart_svg(html, "lr"), "tick-y"),
              ElementsAre("0", "2e-4", "4e-4", "6e-4", "8e-4", "1e-3", "1.2e-3"));
  // One evaluation value, 0.75, at step 50: axes around it.
  EXPECT_THAT(texts_of_class(chart_svg(html, "f1&lt;macro&gt;"), "tick-y"),
              ElementsAre("0.65", "0.70", "0.75", "0.80", "0.85"));
  EXPECT_THAT(texts_of_class(chart_svg(html, "f1&lt;macro&gt;"), "tick-x"),
              ElementsAre("44", "46", "48", "50", "52", "54", "56"));
}

TEST(PlotReport, PointsLandWhereTheAxesSay) {
  TempDir dir("plot_points");
  const std::string html = render_html_report(read_runs(write_two_runs(dir)));
  // Default chart: 1120 x 340, plot area from x = 90 to 1120 - 230 = 890 and from y = 44 to
  // 340 - 52 = 288; the loss axes run over steps [0, 100] and values [0, 1].
  const auto pixel_x = [](double step) { return 90 + step / 100 * 800; };
  const auto pixel_y = [](double value) { return 288 - value * 244; };
  const auto a = polylines_of(chart_svg(html, "loss"), "a");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(a[0].size(), 11u);
  for (int i = 0; i <= 10; ++i) {
    EXPECT_NEAR(a[0][size_t(i)].first, pixel_x(10 * i), 0.006) << "step " << 10 * i;
    EXPECT_NEAR(a[0][size_t(i)].second, pixel_y(1 - i / 10.0), 0.006) << "step " << 10 * i;
  }
  const auto b = polylines_of(chart_svg(html, "loss"), "b");
  ASSERT_EQ(b.size(), 1u);
  ASSERT_EQ(b[0].size(), 6u);
  EXPECT_NEAR(b[0][5].first, pixel_x(50), 0.006);
  EXPECT_NEAR(b[0][5].second, pixel_y(0.65), 0.006);
}

TEST(PlotReport, NaNBreaksTheLineAndALonePointIsADot) {
  std::vector<ChartSeries> series = {{"r", "#112233", {0, 1, 2, 3, 4, 5, 6}, {1, 2, NAN, 3, 4, NAN, 2}}};
  const ChartLayout layout = layout_chart(series);
  expect_ticks(layout.y, {1, 2, 3, 4});
  const std::string svg = render_chart_svg("m", series, layout);
  const auto lines = polylines_of(svg, "r");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].size(), 2u);
  EXPECT_EQ(lines[1].size(), 2u);
  EXPECT_NEAR(lines[1][0].first, layout.x_px(3), 0.006);
  EXPECT_NEAR(lines[1][0].second, layout.y_px(3), 0.006);
  const std::regex dot("<circle class=\"point\" cx=\"([0-9.]+)\" cy=\"([0-9.]+)\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, dot));
  EXPECT_NEAR(std::stod(m[1]), layout.x_px(6), 0.006);
  EXPECT_NEAR(std::stod(m[2]), layout.y_px(2), 0.006);

  const std::vector<ChartSeries> all_null = {{"r", "#112233", {0, 1}, {NAN, NAN}}};
  const std::string empty = render_chart_svg("m", all_null, layout_chart(all_null));
  EXPECT_THAT(empty, HasSubstr("no finite values logged"));
  EXPECT_TRUE(polylines_of(empty, "r").empty());
}

TEST(PlotReport, ALongRunIsThinnedToThePixelColumnsKeepingItsExtremes) {
  ChartSeries s{"r", "#112233", {}, {}};
  for (int step = 0; step < 100000; ++step) {
    s.steps.push_back(step);
    s.values.push_back(std::sin(step * 0.001));
  }
  s.values[31415] = 5;   // a spike and a dip must survive the thinning
  s.values[77777] = -4;
  const ChartLayout layout = layout_chart({s});
  const auto lines = polylines_of(render_chart_svg("m", {s}, layout), "r");
  ASSERT_EQ(lines.size(), 1u);
  // 800 pixel columns, at most 4 points each.
  EXPECT_LE(lines[0].size(), 4u * 801);
  EXPECT_GE(lines[0].size(), 800u);
  const auto has_point = [&](int step) {
    for (const auto& [x, y] : lines[0])
      if (std::fabs(x - layout.x_px(step)) < 0.006 && std::fabs(y - layout.y_px(s.values[size_t(step)])) < 0.006)
        return true;
    return false;
  };
  EXPECT_TRUE(has_point(31415));
  EXPECT_TRUE(has_point(77777));
  EXPECT_TRUE(has_point(0));
  EXPECT_TRUE(has_point(99999));
  for (size_t i = 1; i < lines[0].size(); ++i) ASSERT_GE(lines[0][i].first, lines[0][i - 1].first);
}

TEST(PlotReport, ALongLegendMakesTheChartTaller) {
  std::vector<ChartSeries> series;
  for (int i = 0; i < 30; ++i) series.push_back({"run" + std::to_string(i), "#000000", {0}, {1.0}});
  const ChartLayout layout = layout_chart(series);
  EXPECT_EQ(layout.height, 44 + 30 * 20 + 52);
  EXPECT_EQ(texts_of_class(render_chart_svg("m", series, layout), "legend-entry").size(), 30u);
}

// ---- the command

struct CommandResult {
  int status = -1;
  std::string out, err;
};

CommandResult run_ember(const TempDir& dir, const std::string& args) {
  const std::string cli = ember::testing::env_or("EMBER_CLI", EMBER_CLI);
  const std::string command = "timeout 60 '" + cli + "' " + args + " >'" + dir.file("stdout") + "' 2>'" +
                              dir.file("stderr") + "' </dev/null";
  const int raw = std::system(command.c_str());
  CommandResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_text(dir.file("stdout"));
  r.err = read_text(dir.file("stderr"));
  return r;
}

TEST(PlotCommand, WritesTheReportAndPrintsItsPath) {
  TempDir dir("plot_cli");
  const std::vector<std::string> runs = write_two_runs(dir);
  CommandResult r = run_ember(dir, "plot " + runs[0] + " " + runs[1]);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, runs[0] + "/report.html\n");
  const std::string html = read_text(runs[0] + "/report.html");
  EXPECT_THAT(texts_of_class(html, "chart-title"), ElementsAre("loss", "lr", "f1&lt;macro&gt;"));
  EXPECT_EQ(html, render_html_report(read_runs(runs)));

  // A project directory: its runs, and the report in it by default.
  r = run_ember(dir, "plot " + dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, dir.file("report.html") + "\n");
  EXPECT_THAT(texts_of_class(chart_svg(read_text(dir.file("report.html")), "loss"), "legend-entry"),
              ElementsAre("a", "b"));

  r = run_ember(dir, "plot -o " + dir.file("out.html") + " " + runs[1]);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, dir.file("out.html") + "\n");
  EXPECT_THAT(texts_of_class(read_text(dir.file("out.html")), "chart-title"), ElementsAre("loss", "f1&lt;macro&gt;"));
  r = run_ember(dir, "plot " + runs[1] + " --output=" + dir.file("out2.html"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, dir.file("out2.html") + "\n");
}

TEST(PlotCommand, WarnsAboutACutOffLastLine) {
  TempDir dir("plot_cli_cut");
  const std::vector<std::string> runs = write_two_runs(dir);
  std::ofstream(runs[1] + "/metrics.jsonl", std::ios::app) << "{\"step\":60,\"wall_ti";
  const CommandResult r = run_ember(dir, "plot " + runs[1]);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("ember plot: warning: " + runs[1] + "/metrics.jsonl:8: skipped the last line"));
  EXPECT_THAT(read_text(runs[1] + "/report.html"), HasSubstr("skipped the last line"));
}

TEST(PlotCommand, ErrorsAndUsage) {
  TempDir dir("plot_cli_errors");
  const std::vector<std::string> runs = write_two_runs(dir);
  std::filesystem::create_directories(dir.file("empty"));
  CommandResult r = run_ember(dir, "plot " + dir.file("empty"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("ember plot: " + dir.file("empty") + " has no metrics.jsonl"));

  std::ofstream(runs[0] + "/metrics.jsonl", std::ios::app) << "not json\n" << line(200, "\"loss\":1");
  r = run_ember(dir, "plot " + runs[0]);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr(runs[0] + "/metrics.jsonl:12: not a JSON object"));

  r = run_ember(dir, "plot");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("ember plot: no run directory given"));
  EXPECT_THAT(r.err, HasSubstr("usage: ember plot RUN_DIR [RUN_DIR ...] [-o FILE]"));
  r = run_ember(dir, "plot " + runs[1] + " -o");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("-o needs a file name"));
  r = run_ember(dir, "plot --log-y " + runs[1]);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown option '--log-y'"));
  r = run_ember(dir, "plot --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("project directory"));
  r = run_ember(dir, "--help");
  EXPECT_THAT(r.out, HasSubstr("plot      draw runs' logged metrics"));
}

}  // namespace
}  // namespace ember::plot
