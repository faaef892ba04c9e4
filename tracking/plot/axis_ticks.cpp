// Nice tick spacing: divide the span into `target` parts, round that part up to 1, 2 or 5 times
// a power of ten, then widen the range outwards to whole multiples of it. Ticks are computed as
// integer multiples of the spacing (not by repeated addition) so rounding does not accumulate.
#include "tracking/plot/axis_ticks.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "core/error.h"

namespace ember::plot {

namespace {

double round_up_to_nice(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  // The small slack keeps 0.2/0.1 = 2.0000000000000004 from being rounded up to 5.
  for (double nice : {1.0, 2.0, 5.0})
    if (fraction <= nice * (1 + 1e-9)) return nice * magnitude;
  return 10 * magnitude;
}

// The decimal exponent of the spacing (0.05 -> -2, 200 -> 2).
int spacing_exponent(double spacing) { return int(std::floor(std::log10(spacing) + 1e-9)); }

std::string with_thousands_separators(long long n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string scientific(double value, int spacing_exp) {
  const int exponent = int(std::floor(std::log10(std::fabs(value)) + 1e-9));
  const int decimals = std::max(0, exponent - spacing_exp);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value / std::pow(10.0, exponent));
  std::string mantissa = buf;
  if (mantissa.find('.') != std::string::npos) {
    mantissa.erase(mantissa.find_last_not_of('0') + 1);
    if (mantissa.back() == '.') mantissa.pop_back();
  }
  // Rounding may carry the mantissa to 10 (9.99e-5 shown with one digit): renormalise.
  if (mantissa == "10" || mantissa == "-10") return scientific(value, spacing_exp - 1);
  return mantissa + "e" + std::to_string(exponent);
}

}  // namespace

AxisTicks nice_ticks(double min, double max, int target, bool integer_spacing) {
  EMBER_CHECK(std::isfinite(min) && std::isfinite(max) && min <= max, "plot: axis range [", min, ", ", max,
              "] is not a finite interval");
  EMBER_CHECK(target >= 1, "plot: tick count ", target, " must be positive");
  // Ranges near the ends of double (1e308, where max - min overflows; 1e-320, where a tenth of
  // a value underflows) are ticked scaled to about 1 and scaled back. The scale is applied as
  // two powers of ten, each of which is a normal double.
  // Below 1e-290 ticks would collapse onto the few denormal doubles: the axis reaches 1e-290.
  if (const double m = std::max(std::fabs(min), std::fabs(max)); m > 0 && m < 1e-290) {
    min = std::min(min, 0.0);
    max = std::max(max, 1e-290);
  }
  const double largest = std::max(std::fabs(min), std::fabs(max));
  const int exponent = largest == 0 ? 0 : int(std::floor(std::log10(largest)));
  if (std::abs(exponent) > 200) {
    const double a = std::pow(10.0, exponent / 2), b = std::pow(10.0, exponent - exponent / 2);
    AxisTicks ticks = nice_ticks(min / a / b, max / a / b, target, false);
    // Ticks past the largest double are pinned to it, and repeats dropped.
    const auto back = [&](double v) { return std::clamp(v * a * b, -DBL_MAX, DBL_MAX); };
    std::vector<double> values;
    for (double v : ticks.values)
      if (values.empty() || back(v) != values.back()) values.push_back(back(v));
    ticks.values = values;
    ticks.spacing = ticks.spacing * a * b;
    ticks.lo = ticks.values.front();
    ticks.hi = ticks.values.back();
    return ticks;
  }
  if (min == max) {
    // A lone value sits mid-axis: 10% of its size either side, or +-1 around zero.
    const double pad = min == 0 ? 1.0 : std::fabs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  AxisTicks ticks;
  ticks.spacing = round_up_to_nice((max - min) / target);
  if (integer_spacing) ticks.spacing = std::max(ticks.spacing, 1.0);
  const double first = std::floor(min / ticks.spacing + 1e-9);
  const double last = std::ceil(max / ticks.spacing - 1e-9);
  // About `target` ticks by construction; counted by an integer so that huge multiples (where
  // k + 1 == k in double) cannot loop.
  const int64_t count = std::clamp<int64_t>(int64_t(last - first), 1, 4 * int64_t(target) + 4);
  // Past 2^53 neighbouring multiples can round to one double: each value is kept once.
  for (int64_t i = 0; i <= count; ++i) {
    const double value = (first + double(i)) * ticks.spacing;
    if (ticks.values.empty() || value > ticks.values.back()) ticks.values.push_back(value);
  }
  ticks.lo = ticks.values.front();
  ticks.hi = ticks.values.back();
  return ticks;
}

std::string format_tick(double value, const AxisTicks& ticks) {
  const double largest = std::max(std::fabs(ticks.lo), std::fabs(ticks.hi));
  const int spacing_exp = spacing_exponent(ticks.spacing);
  // A multiple of the spacing computed as 0.1 * 3 - 0.3 is zero: print it as one.
  if (std::fabs(value) < ticks.spacing * 1e-6) value = 0;
  if (largest >= 1e7 || spacing_exp < -3) return value == 0 ? "0" : scientific(value, spacing_exp);
  if (spacing_exp >= 0) return with_thousands_separators(std::llround(value));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", -spacing_exp, value);
  return buf;
}

}  // namespace ember::plot
