// One chart as inline SVG: a metric's value against the step for every run that logged it,
// one colour per run, with nice ticks, grid, axis labels and a legend on the right. The layout
// (where a step and a value land in pixels) is its own value so the page assembler and the
// tests can place and find the drawn points without parsing the SVG.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tracking/plot/axis_ticks.h"

namespace ember::plot {

struct ChartSeries {
  std::string run;     // legend text
  std::string colour;  // CSS colour, "#rrggbb"
  std::vector<int64_t> steps;
  std::vector<double> values;  // NaN breaks the line
};

// Sizes in CSS pixels. The plot area is the box inside the margins; the legend sits in the
// right margin, one run per row, and makes the chart taller when it needs to.
struct ChartGeometry {
  double width = 1120, height = 340;
  double margin_left = 90, margin_right = 230, margin_top = 44, margin_bottom = 52;
  double legend_row = 20;
};

struct ChartLayout {
  ChartGeometry geometry;
  double height = 0;  // the drawn height: geometry.height, or more for a long legend
  AxisTicks x, y;

  double plot_left() const { return geometry.margin_left; }
  double plot_right() const { return geometry.width - geometry.margin_right; }
  double plot_top() const { return geometry.margin_top; }
  double plot_bottom() const { return height - geometry.margin_bottom; }
  // Pixel position, relative to the chart's top-left corner, of a step and of a value.
  double x_px(double step) const;
  double y_px(double value) const;
};

// Ticks covering every run's steps (x) and finite values (y); [0, 1] when no value is finite.
ChartLayout layout_chart(const std::vector<ChartSeries>& series, const ChartGeometry& geometry = {});

// The <svg> element for the metric `title`.
std::string render_chart_svg(const std::string& title, const std::vector<ChartSeries>& series,
                             const ChartLayout& layout);

// Text made safe inside XML/HTML elements and quoted attributes.
std::string xml_escape(const std::string& text);

}  // namespace ember::plot
