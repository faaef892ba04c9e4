// Assembling the report page. The layout is deliberately rigid (fixed header height, charts of
// known size stacked at known offsets) so a reader can compare charts by scrolling and a test
// can find a chart's pixels in a screenshot; everything else is plain HTML tables.
#include "tracking/plot/html_report.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/error.h"

namespace ember::plot {

namespace fs = std::filesystem;

namespace {

// The page's CSS; the header's height and the charts' offsets come from the constants in
// html_report.h, which is where the rest of the code (and the tests) read them.
std::string page_style() {
  const auto css_px = [](double v) { return std::to_string(int(v)) + "px"; };
  const std::string margin = css_px(kReportMargin);
  std::ostringstream css;
  css << "\nbody { margin: 0; background: #ffffff; color: #222222;"
         " font-family: \"DejaVu Sans\", Helvetica, Arial, sans-serif; font-size: 14px; }\n"
      << "header { box-sizing: border-box; height: " << css_px(kReportHeaderHeight) << "; padding: 14px "
      << margin << " 0 " << margin << "; overflow: hidden; }\n"
      << "h1 { margin: 0 0 6px 0; font-size: 22px; }\n"
         "header p { margin: 0; color: #555555; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }\n"
         ".swatch { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 10px; vertical-align: -1px; }\n"
      << "figure.chart-box { margin: 0 0 " << css_px(kReportChartGap) << " " << margin << "; padding: 0; }\n"
      << "figure.chart-box svg { display: block; }\n"
      << "section { margin: 24px " << margin << "; }\n"
      << "h2 { font-size: 18px; margin: 0 0 8px 0; }\n"
         "table { border-collapse: collapse; }\n"
         "th, td { border: 1px solid #d0d0d0; padding: 4px 10px; text-align: left; vertical-align: top;"
         " font-variant-numeric: tabular-nums; }\n"
         "th { background: #f3f3f3; }\n"
         "td.differs { background: #fff4d6; }\n"
         ".warnings li { color: #9a4a00; }\n";
  return css.str();
}

std::string swatch(const std::string& colour) {
  return "<span class=\"swatch\" style=\"background:" + colour + "\"></span>";
}

// Hyper-parameters as one table: a row per key (first-seen order over the runs), a column per
// run; a row whose runs disagree is highlighted, since that is usually what is being compared.
void write_config_table(std::ostringstream& html, const std::vector<RunMetrics>& runs) {
  std::vector<std::string> keys;
  std::vector<std::map<std::string, std::string>> by_run(runs.size());
  for (size_t r = 0; r < runs.size(); ++r)
    for (const auto& [key, value] : runs[r].config) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
      by_run[r][key] = value;
    }
  html << "<section class=\"configs\">\n<h2>Configuration</h2>\n";
  if (keys.empty()) {
    html << "<p>No run has a config.json.</p>\n</section>\n";
    return;
  }
  html << "<table>\n<tr><th>parameter</th>";
  for (size_t r = 0; r < runs.size(); ++r) html << "<th>" << swatch(run_colour(r)) << xml_escape(runs[r].name) << "</th>";
  html << "</tr>\n";
  for (const std::string& key : keys) {
    std::vector<std::string> cells;
    for (size_t r = 0; r < runs.size(); ++r) {
      const auto it = by_run[r].find(key);
      cells.push_back(it == by_run[r].end() ? "" : it->second);
    }
    const bool differs = std::adjacent_find(cells.begin(), cells.end(), std::not_equal_to<>()) != cells.end();
    html << "<tr><th>" << xml_escape(key) << "</th>";
    for (size_t r = 0; r < runs.size(); ++r) {
      html << "<td" << (differs ? " class=\"differs\"" : "") << ">";
      html << (by_run[r].count(key) ? xml_escape(cells[r]) : "&mdash;") << "</td>";
    }
    html << "</tr>\n";
  }
  html << "</table>\n</section>\n";
}

void write_run_table(std::ostringstream& html, const std::vector<RunMetrics>& runs) {
  html << "<section class=\"runs\">\n<h2>Runs</h2>\n<table>\n"
          "<tr><th>run</th><th>directory</th><th>metrics</th><th>steps</th></tr>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunMetrics& run = runs[r];
    int64_t first = 0, last = 0;
    bool any = false;
    for (const MetricSeries& s : run.metrics)
      if (!s.steps.empty()) {
        first = any ? std::min(first, s.steps.front()) : s.steps.front();
        last = any ? std::max(last, s.steps.back()) : s.steps.back();
        any = true;
      }
    html << "<tr><td>" << swatch(run_colour(r)) << xml_escape(run.name) << "</td><td>" << xml_escape(run.dir)
         << "</td><td>" << run.metrics.size() << "</td><td>"
         << (any ? std::to_string(first) + " &ndash; " + std::to_string(last) : "none logged") << "</td></tr>\n";
  }
  html << "</table>\n";
  std::vector<std::string> warnings;
  for (const RunMetrics& run : runs) warnings.insert(warnings.end(), run.warnings.begin(), run.warnings.end());
  if (!warnings.empty()) {
    html << "<ul class=\"warnings\">\n";
    for (const std::string& w : warnings) html << "<li>" << xml_escape(w) << "</li>\n";
    html << "</ul>\n";
  }
  html << "</section>\n";
}

}  // namespace

const std::string& run_colour(size_t index) {
  // Ten hues that stay apart on white and for the common colour-vision deficiencies;
  // an eleventh run reuses the first colour.
  static const std::vector<std::string> palette = {"#1f5fbf", "#e8590c", "#2b9348", "#c2255c", "#7048e8",
                                                   "#8d6e00", "#0b9aa8", "#5c5c5c", "#d6336c", "#364fc7"};
  return palette[index % palette.size()];
}

std::vector<ReportChart> build_report_charts(const std::vector<RunMetrics>& runs) {
  std::vector<std::string> metrics;
  for (const RunMetrics& run : runs)
    for (const MetricSeries& s : run.metrics)
      if (std::find(metrics.begin(), metrics.end(), s.name) == metrics.end()) metrics.push_back(s.name);

  std::vector<ReportChart> charts;
  double top = kReportHeaderHeight;
  for (const std::string& metric : metrics) {
    ReportChart chart;
    chart.metric = metric;
    for (size_t r = 0; r < runs.size(); ++r)
      if (const MetricSeries* s = runs[r].find(metric))
        chart.series.push_back({runs[r].name, run_colour(r), s->steps, s->values});
    chart.layout = layout_chart(chart.series);
    chart.top = top;
    top += chart.layout.height + kReportChartGap;
    charts.push_back(std::move(chart));
  }
  return charts;
}

std::string render_html_report(const std::vector<RunMetrics>& runs) {
  std::ostringstream html;
  std::string names;
  for (const RunMetrics& run : runs) names += (names.empty() ? "" : ", ") + run.name;
  html << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<meta name=\"viewport\" content=\"width=1200\">\n"
       << "<title>Training report: " << xml_escape(names) << "</title>\n<style>" << page_style() << "</style>\n</head>\n<body>\n";
  html << "<header>\n<h1>Training report</h1>\n<p>" << runs.size() << (runs.size() == 1 ? " run:" : " runs:");
  for (size_t r = 0; r < runs.size(); ++r) html << swatch(run_colour(r)) << xml_escape(runs[r].name);
  html << "</p>\n</header>\n<main>\n";

  const std::vector<ReportChart> charts = build_report_charts(runs);
  if (charts.empty()) html << "<section><p>No metrics logged yet.</p></section>\n";
  for (const ReportChart& chart : charts)
    html << "<figure class=\"chart-box\" id=\"metric-" << xml_escape(chart.metric) << "\">\n"
         << render_chart_svg(chart.metric, chart.series, chart.layout) << "</figure>\n";
  write_config_table(html, runs);
  write_run_table(html, runs);
  html << "</main>\n</body>\n</html>\n";
  return html.str();
}

std::string write_html_report(const std::vector<std::string>& run_dirs, const std::string& out_file,
                              std::vector<std::string>* warnings) {
  EMBER_CHECK(!run_dirs.empty(), "plot: no run directory given");
  const std::vector<RunMetrics> runs = read_runs(run_dirs);
  if (warnings)
    for (const RunMetrics& run : runs) warnings->insert(warnings->end(), run.warnings.begin(), run.warnings.end());
  const std::string path = out_file.empty() ? (fs::path(run_dirs.front()) / "report.html").string() : out_file;
  const std::string html = render_html_report(runs);

  // Written aside and renamed into place, so a browser reloading the report during training
  // never sees half a page.
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    EMBER_CHECK(out, "plot: cannot write ", temporary);
    out << html;
    out.close();
    EMBER_CHECK(out, "plot: writing ", temporary, " failed");
  }
  std::error_code ec;
  fs::rename(temporary, path, ec);
  if (ec) fs::remove(temporary);
  EMBER_CHECK(!ec, "plot: cannot move ", temporary, " to ", path, ": ", ec.message());
  return path;
}

}  // namespace ember::plot
