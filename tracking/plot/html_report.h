// The training report: one self-contained HTML page (inline SVG and CSS, no script, nothing
// fetched) with a chart per metric overlaying every run that logged it, then the runs'
// hyper-parameters side by side. This is what `ember plot` writes and what a training program
// can write at the end of training.
#pragma once
#include <string>
#include <vector>

#include "tracking/plot/run_metrics.h"
#include "tracking/plot/svg_chart.h"

namespace ember::plot {

// The page's fixed layout, in CSS pixels: charts start below a header of fixed height, flush
// at kReportMargin from the left, one under the other kReportChartGap apart. Fixed so that
// where a chart lands on screen follows from the layouts alone.
inline constexpr double kReportMargin = 20;
inline constexpr double kReportHeaderHeight = 76;
inline constexpr double kReportChartGap = 16;

// A metric's chart: the runs that logged it, in the order the runs were given.
struct ReportChart {
  std::string metric;
  std::vector<ChartSeries> series;
  ChartLayout layout;
  double top = 0;  // page y of the chart's top edge
};

// The charts in page order: metrics in first-seen order over the runs, runs coloured by position.
std::vector<ReportChart> build_report_charts(const std::vector<RunMetrics>& runs);

// The colour of the i-th run.
const std::string& run_colour(size_t index);

std::string render_html_report(const std::vector<RunMetrics>& runs);

// Reads the runs (each path a run directory, or a directory of run directories), writes the
// report to out_file (empty: <first path>/report.html) through a temporary file and a rename,
// and returns the path written. Lines skipped while reading (a cut-off last line) are appended
// to *warnings when given.
std::string write_html_report(const std::vector<std::string>& run_dirs, const std::string& out_file = "",
                              std::vector<std::string>* warnings = nullptr);

}  // namespace ember::plot
