// Axis ticks for the charts: "nice" values (1, 2 or 5 times a power of ten apart) whose first
// and last tick enclose the data, and the labels printed at them. Kept apart from the drawing
// so the numbers a reader sees can be tested on their own.
#pragma once
#include <string>
#include <vector>

namespace ember::plot {

struct AxisTicks {
  double lo = 0, hi = 1;      // the axis range: the first and last tick
  double spacing = 0.2;       // 1, 2 or 5 x 10^k
  std::vector<double> values; // lo, lo + spacing, ..., hi
};

// About `target` intervals covering [min, max]. A single value (min == max) gets a small range
// around it; integer_spacing keeps the spacing >= 1 (for steps).
AxisTicks nice_ticks(double min, double max, int target = 5, bool integer_spacing = false);

// The label for one tick of `ticks`. One style per axis, chosen from the spacing and the largest
// tick: whole numbers with thousands separators ("12,000") when the spacing is >= 1; fixed
// decimals ("0.25") when the spacing is >= 0.001; otherwise, and for ticks of 10^7 or more,
// shortest scientific ("1e-4", "2.5e-5", "3e10"). Zero is always "0".
std::string format_tick(double value, const AxisTicks& ticks);

}  // namespace ember::plot
