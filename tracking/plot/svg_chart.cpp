// Drawing one chart. Presentation is set with SVG attributes rather than page CSS so a chart
// copied out of the report still looks the same. Each run is drawn as polylines over its runs of
// finite values (a NaN ends one and the next finite value starts another), and a finite value
// with no finite neighbour is drawn as a dot, since a one-point line is invisible. Long runs
// are thinned to what the plot's pixel columns can show.
#include "tracking/plot/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace ember::plot {

namespace {

std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// The indices of s[begin, end) worth drawing. A run with far more points than the plot has pixel
// columns keeps, per column, its first, lowest, highest and last point: the drawn line then
// covers the same pixels (spikes included) at a fraction of the page size.
std::vector<size_t> points_to_draw(const ChartSeries& s, size_t begin, size_t end, const ChartLayout& layout) {
  std::vector<size_t> keep;
  const double columns = layout.plot_right() - layout.plot_left();
  if (double(end - begin) <= 2 * columns) {
    for (size_t i = begin; i < end; ++i) keep.push_back(i);
    return keep;
  }
  for (size_t first = begin; first < end;) {
    const double column = std::floor(layout.x_px(double(s.steps[first])));
    size_t last = first, low = first, high = first;
    while (last + 1 < end && std::floor(layout.x_px(double(s.steps[last + 1]))) == column) {
      ++last;
      if (s.values[last] < s.values[low]) low = last;
      if (s.values[last] > s.values[high]) high = last;
    }
    for (size_t i : {first, std::min(low, high), std::max(low, high), last})
      if (keep.empty() || keep.back() != i) keep.push_back(i);
    first = last + 1;
  }
  return keep;
}

void draw_series(std::ostringstream& svg, const ChartSeries& s, const ChartLayout& layout) {
  svg << "<g class=\"series\" data-run=\"" << xml_escape(s.run) << "\">\n";
  size_t i = 0;
  while (i < s.values.size()) {
    if (!std::isfinite(s.values[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < s.values.size() && std::isfinite(s.values[end])) ++end;
    if (end - i == 1) {
      svg << "<circle class=\"point\" cx=\"" << px(layout.x_px(double(s.steps[i]))) << "\" cy=\""
          << px(layout.y_px(s.values[i])) << "\" r=\"3.5\" fill=\"" << s.colour << "\"/>\n";
    } else {
      svg << "<polyline fill=\"none\" stroke=\"" << s.colour
          << "\" stroke-width=\"2\" stroke-linejoin=\"round\" stroke-linecap=\"round\" points=\"";
      const char* separator = "";
      for (size_t k : points_to_draw(s, i, end, layout)) {
        svg << separator << px(layout.x_px(double(s.steps[k]))) << "," << px(layout.y_px(s.values[k]));
        separator = " ";
      }
      svg << "\"/>\n";
    }
    i = end;
  }
  svg << "</g>\n";
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

double ChartLayout::x_px(double step) const {
  return plot_left() + (step - x.lo) / (x.hi - x.lo) * (plot_right() - plot_left());
}

double ChartLayout::y_px(double value) const {
  return plot_bottom() - (value - y.lo) / (y.hi - y.lo) * (plot_bottom() - plot_top());
}

ChartLayout layout_chart(const std::vector<ChartSeries>& series, const ChartGeometry& geometry) {
  EMBER_CHECK(!series.empty(), "plot: a chart needs at least one run");
  ChartLayout layout;
  layout.geometry = geometry;
  layout.height = std::max(geometry.height, geometry.margin_top + geometry.legend_row * double(series.size()) +
                                                geometry.margin_bottom);
  double step_min = std::numeric_limits<double>::infinity(), step_max = -step_min;
  double value_min = step_min, value_max = -step_min;
  for (const ChartSeries& s : series) {
    EMBER_CHECK(s.steps.size() == s.values.size(), "plot: run ", s.run, " has ", s.steps.size(), " steps but ",
                s.values.size(), " values");
    for (size_t i = 0; i < s.steps.size(); ++i) {
      step_min = std::min(step_min, double(s.steps[i]));
      step_max = std::max(step_max, double(s.steps[i]));
      if (!std::isfinite(s.values[i])) continue;
      value_min = std::min(value_min, s.values[i]);
      value_max = std::max(value_max, s.values[i]);
    }
  }
  if (step_min > step_max) step_min = step_max = 0;
  if (value_min > value_max) value_min = 0, value_max = 1;
  layout.x = nice_ticks(step_min, step_max, 8, /*integer_spacing=*/true);
  layout.y = nice_ticks(value_min, value_max, 5);
  return layout;
}

std::string render_chart_svg(const std::string& title, const std::vector<ChartSeries>& series,
                             const ChartLayout& layout) {
  const double left = layout.plot_left(), right = layout.plot_right();
  const double top = layout.plot_top(), bottom = layout.plot_bottom();
  const double width = layout.geometry.width, height = layout.height;
  std::ostringstream svg;
  svg << "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << px(width) << "\" height=\""
      << px(height) << "\" viewBox=\"0 0 " << px(width) << " " << px(height) << "\" data-metric=\""
      << xml_escape(title) << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  svg << "<rect x=\"0\" y=\"0\" width=\"" << px(width) << "\" height=\"" << px(height)
      << "\" fill=\"#ffffff\" stroke=\"#d0d0d0\"/>\n";
  svg << "<text class=\"chart-title\" x=\"" << px(left) << "\" y=\"28\" font-size=\"16\" font-weight=\"bold\" fill=\"#222222\">"
      << xml_escape(title) << "</text>\n";

  // Grid and tick labels first, so the data is drawn over them.
  for (double v : layout.x.values) {
    const std::string x = px(layout.x_px(v));
    svg << "<line class=\"grid\" x1=\"" << x << "\" y1=\"" << px(top) << "\" x2=\"" << x << "\" y2=\"" << px(bottom)
        << "\" stroke=\"#e6e6e6\"/>\n";
    svg << "<text class=\"tick-x\" x=\"" << x << "\" y=\"" << px(bottom + 18)
        << "\" text-anchor=\"middle\" fill=\"#444444\">" << format_tick(v, layout.x) << "</text>\n";
  }
  for (double v : layout.y.values) {
    const std::string y = px(layout.y_px(v));
    svg << "<line class=\"grid\" x1=\"" << px(left) << "\" y1=\"" << y << "\" x2=\"" << px(right) << "\" y2=\"" << y
        << "\" stroke=\"#e6e6e6\"/>\n";
    svg << "<text class=\"tick-y\" x=\"" << px(left - 8) << "\" y=\"" << px(layout.y_px(v) + 4)
        << "\" text-anchor=\"end\" fill=\"#444444\">" << format_tick(v, layout.y) << "</text>\n";
  }
  svg << "<polyline class=\"axes\" fill=\"none\" stroke=\"#555555\" points=\"" << px(left) << "," << px(top) << " "
      << px(left) << "," << px(bottom) << " " << px(right) << "," << px(bottom) << "\"/>\n";
  svg << "<text class=\"axis-label\" x=\"" << px((left + right) / 2) << "\" y=\"" << px(height - 12)
      << "\" text-anchor=\"middle\" fill=\"#222222\">step</text>\n";
  svg << "<text class=\"axis-label\" transform=\"translate(18," << px((top + bottom) / 2)
      << ") rotate(-90)\" text-anchor=\"middle\" fill=\"#222222\">" << xml_escape(title) << "</text>\n";

  bool any_finite = false;
  for (const ChartSeries& s : series) {
    any_finite = any_finite || std::any_of(s.values.begin(), s.values.end(), [](double v) { return std::isfinite(v); });
    draw_series(svg, s, layout);
  }
  if (!any_finite)
    svg << "<text class=\"no-data\" x=\"" << px((left + right) / 2) << "\" y=\"" << px((top + bottom) / 2)
        << "\" text-anchor=\"middle\" fill=\"#888888\">no finite values logged</text>\n";

  svg << "<g class=\"legend\">\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const double y = top + 10 + layout.geometry.legend_row * double(i);
    svg << "<line x1=\"" << px(right + 16) << "\" y1=\"" << px(y) << "\" x2=\"" << px(right + 40) << "\" y2=\""
        << px(y) << "\" stroke=\"" << series[i].colour << "\" stroke-width=\"3\"/>\n";
    // A long run name is squeezed into the margin rather than cut.
    const double room = width - (right + 48) - 8;
    svg << "<text class=\"legend-entry\" x=\"" << px(right + 48) << "\" y=\"" << px(y + 4) << "\" fill=\"#222222\"";
    if (series[i].run.size() > 28) svg << " textLength=\"" << px(room) << "\" lengthAdjust=\"spacingAndGlyphs\"";
    svg << ">" << xml_escape(series[i].run) << "</text>\n";
  }
  svg << "</g>\n</svg>\n";
  return svg.str();
}

}  // namespace ember::plot
