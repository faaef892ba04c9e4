// The report as a browser draws it: two runs with known curves are written, the report is
// rendered by headless Chromium to a PNG, and the screenshot is decoded and checked: the page is
// not blank, each run's colour is drawn, the curves pass through the pixels where their data
// points belong (from the chart layout the report used and its fixed page layout), and the
// tick labels stand beside the grid lines they name. Skips when Chromium is not installed.
// The screenshot decoder is checked first on PNGs built here with every row filter.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "png_reader.h"
#include "test_util.h"
#include "tracking/plot/html_report.h"

namespace ember::plot {
namespace {

using ::testing::ElementsAre;
using ember::testing::RgbImage;
using ember::testing::TempDir;

std::string find_chromium() {
  if (const char* path = std::getenv("EMBER_CHROMIUM"); path && *path) return path;
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (::access(path, X_OK) == 0) return path;
  return "";
}

struct Rgb {
  int r, g, b;
};

Rgb parse_colour(const std::string& hex) {
  return {std::stoi(hex.substr(1, 2), nullptr, 16), std::stoi(hex.substr(3, 2), nullptr, 16),
          std::stoi(hex.substr(5, 2), nullptr, 16)};
}

// Within a small per-channel distance: the centre of an anti-aliased 2 px line keeps its colour.
bool near_colour(const uint8_t* p, Rgb c, int tolerance = 48) {
  return std::abs(p[0] - c.r) <= tolerance && std::abs(p[1] - c.g) <= tolerance && std::abs(p[2] - c.b) <= tolerance;
}

bool colour_within(const RgbImage& image, double x, double y, int radius, Rgb c) {
  for (int dy = -radius; dy <= radius; ++dy)
    for (int dx = -radius; dx <= radius; ++dx) {
      const int px = int(std::lround(x)) + dx, py = int(std::lround(y)) + dy;
      if (px >= 0 && py >= 0 && px < image.width && py < image.height && near_colour(image.pixel(px, py), c))
        return true;
    }
  return false;
}

int count_dark(const RgbImage& image, int x0, int y0, int x1, int y1) {
  int n = 0;
  for (int y = std::max(0, y0); y < std::min(image.height, y1); ++y)
    for (int x = std::max(0, x0); x < std::min(image.width, x1); ++x) {
      const uint8_t* p = image.pixel(x, y);
      if (p[0] + p[1] + p[2] < 3 * 140) ++n;
    }
  return n;
}

std::string jsonl_line(int step, const std::string& values) {
  return "{\"step\":" + std::to_string(step) + ",\"wall_time\":1764561234.5," + values + "}\n";
}

// alpha: loss 1 - 0.008 step, lr 1e-5 + 2.9e-6 step; beta: loss 0.9 - 0.004 step,
// lr 3e-4 - 2.9e-6 step; steps 0, 5, ..., 100.
double alpha_loss(int step) { return 1 - 0.008 * step; }
double beta_loss(int step) { return 0.9 - 0.004 * step; }
double alpha_lr(int step) { return 1e-5 + 2.9e-6 * step; }
double beta_lr(int step) { return 3e-4 - 2.9e-6 * step; }

std::string number(double v) {
  std::ostringstream ss;
  ss.precision(17);
  ss << v;
  return ss.str();
}

// ---- the screenshot decoder, on images built here

std::string be32(uint32_t v) {
  return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

std::string chunk(const std::string& type, const std::string& data) {
  const std::string body = type + data;
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(body.data()), uInt(body.size()));
  return be32(uint32_t(data.size())) + body + be32(uint32_t(crc));
}

// A PNG of `pixels` (rows of `channels`-byte pixels), row y stored with filter y % 5, the
// filters applied forward as the PNG specification defines them.
std::string encode_png(int width, int height, int channels, const std::vector<uint8_t>& pixels) {
  const size_t stride = size_t(width) * size_t(channels);
  std::string raw;
  for (int y = 0; y < height; ++y) {
    const int filter = y % 5;
    raw += char(filter);
    for (size_t i = 0; i < stride; ++i) {
      const int x = pixels[size_t(y) * stride + i];
      const int a = i >= size_t(channels) ? pixels[size_t(y) * stride + i - size_t(channels)] : 0;
      const int b = y > 0 ? pixels[size_t(y - 1) * stride + i] : 0;
      const int c = (y > 0 && i >= size_t(channels)) ? pixels[size_t(y - 1) * stride + i - size_t(channels)] : 0;
      const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
      const int paeth = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      const int predictions[5] = {0, a, b, (a + b) / 2, paeth};
      raw += char(uint8_t(x - predictions[filter]));
    }
  }
  std::vector<Bytef> packed(compressBound(uLong(raw.size())));
  uLongf packed_size = uLongf(packed.size());
  EXPECT_EQ(compress(packed.data(), &packed_size, reinterpret_cast<const Bytef*>(raw.data()), uLong(raw.size())), Z_OK);
  const std::string idat(reinterpret_cast<const char*>(packed.data()), packed_size);
  const std::string header = be32(uint32_t(width)) + be32(uint32_t(height)) + char(8) + char(channels == 3 ? 2 : 6) +
                             std::string(3, '\0');
  // The image data split over two IDAT chunks, as encoders may do.
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", header) + chunk("IDAT", idat.substr(0, idat.size() / 2)) +
         chunk("IDAT", idat.substr(idat.size() / 2)) + chunk("IEND", "");
}

TEST(PngReader, DecodesEveryFilterInRgbAndRgba) {
  for (int channels : {3, 4}) {
    const int width = 7, height = 10;
    std::vector<uint8_t> pixels(size_t(width * height * channels));
    for (uint8_t& v : pixels) v = uint8_t(ember::testing::uniform_int(0, 255));
    const RgbImage image = ember::testing::decode_png(encode_png(width, height, channels, pixels));
    ASSERT_EQ(image.width, width);
    ASSERT_EQ(image.height, height);
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x)
        for (int c = 0; c < 3; ++c)
          ASSERT_EQ(image.pixel(x, y)[c], pixels[size_t((y * width + x) * channels + c)])
              << channels << " channels, pixel " << x << "," << y << " channel " << c;
  }
}

TEST(PngReader, RefusesDamagedFiles) {
  const std::string good = encode_png(2, 2, 3, std::vector<uint8_t>(12, 9));
  EXPECT_EMBER_ERROR(ember::testing::decode_png("GIF89a"), "not a PNG file");
  EXPECT_EMBER_ERROR(ember::testing::decode_png(good.substr(0, good.size() - 20)), "png:");
  std::string flipped = good;
  flipped[40] = char(flipped[40] ^ 1);
  EXPECT_EMBER_ERROR(ember::testing::decode_png(flipped), "CRC mismatch");
}

// ---- the page in a browser

TEST(PlotRender, ChromiumDrawsTheCurvesWhereTheAxesSay) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "Chromium is not installed (apt-get install chromium)";

  TempDir dir("plot_render");
  std::filesystem::create_directories(dir.file("alpha"));
  std::filesystem::create_directories(dir.file("beta"));
  std::string alpha, beta;
  for (int step = 0; step <= 100; step += 5) {
    alpha += jsonl_line(step, "\"loss\":" + number(alpha_loss(step)) + ",\"lr\":" + number(alpha_lr(step)));
    beta += jsonl_line(step, "\"loss\":" + number(beta_loss(step)) + ",\"lr\":" + number(beta_lr(step)));
  }
  std::ofstream(dir.file("alpha/metrics.jsonl")) << alpha;
  std::ofstream(dir.file("beta/metrics.jsonl")) << beta;
  const std::string page = write_html_report({dir.file("alpha"), dir.file("beta")}, dir.file("report.html"));

  // The axes carry the logged ranges: loss [0.2, 1] on 0.2..1.0, lr [1e-5, 3e-4] on 0..3e-4.
  std::ifstream in(page);
  std::stringstream html;
  html << in.rdbuf();
  std::vector<std::string> y_labels;
  const std::regex tick("class=\"tick-y\"[^>]*>([^<]*)<");
  const std::string text = html.str();
  for (auto it = std::sregex_iterator(text.begin(), text.end(), tick); it != std::sregex_iterator(); ++it)
    y_labels.push_back((*it)[1]);
  EXPECT_THAT(y_labels, ElementsAre("0.2", "0.4", "0.6", "0.8", "1.0", "0", "1e-4", "2e-4", "3e-4"));

  const std::vector<ReportChart> charts = build_report_charts(read_runs({dir.file("alpha"), dir.file("beta")}));
  ASSERT_EQ(charts.size(), 2u);
  EXPECT_DOUBLE_EQ(charts[0].layout.y.lo, 0.2);
  EXPECT_DOUBLE_EQ(charts[0].layout.y.hi, 1.0);
  EXPECT_NEAR(charts[1].layout.y.hi, 3e-4, 1e-15);
  const int width = 1200;
  const int height = int(charts[1].top + charts[1].layout.height) + 40;

  const std::string screenshot = dir.file("shot.png");
  const std::string command = "timeout 60 '" + chromium +
                              "' --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run"
                              " --force-device-scale-factor=1 --user-data-dir='" + dir.file("profile") +
                              "' --window-size=" + std::to_string(width) + "," + std::to_string(height) +
                              " --screenshot='" + screenshot + "' 'file://" + page + "' >'" + dir.file("chromium.log") +
                              "' 2>&1";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(std::filesystem::exists(screenshot))
      << "chromium wrote no screenshot (exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << "); see "
      << dir.file("chromium.log");
  const RgbImage image = ember::testing::read_png(screenshot);
  ASSERT_EQ(image.width, width);
  ASSERT_EQ(image.height, height);

  // Not blank: text, grid, axes and curves cover thousands of pixels.
  int drawn = 0;
  for (size_t i = 0; i < image.rgb.size(); i += 3)
    if (image.rgb[i] < 240 || image.rgb[i + 1] < 240 || image.rgb[i + 2] < 240) ++drawn;
  EXPECT_GT(drawn, 10000);

  const Rgb alpha_colour = parse_colour(run_colour(0)), beta_colour = parse_colour(run_colour(1));
  for (const Rgb c : {alpha_colour, beta_colour}) {
    int n = 0;
    for (int y = 0; y < image.height; ++y)
      for (int x = 0; x < image.width; ++x) n += near_colour(image.pixel(x, y), c, 24);
    EXPECT_GT(n, 1000) << "colour " << c.r << "," << c.g << "," << c.b;
  }

  // Screen position of a step and value in a chart: the page puts chart i at (margin, top_i).
  const auto screen = [](const ReportChart& chart, double step, double value) {
    return std::make_pair(kReportMargin + chart.layout.x_px(step), chart.top + chart.layout.y_px(value));
  };
  const auto expect_drawn = [&](const ReportChart& chart, int step, double value, Rgb c, const char* run) {
    const auto [x, y] = screen(chart, step, value);
    EXPECT_TRUE(colour_within(image, x, y, 2, c))
        << run << " " << chart.metric << " at step " << step << " should be drawn near (" << x << ", " << y << ")";
  };
  // Steps away from where the curves cross (loss at 25, lr at 50).
  for (int step : {0, 10, 40, 70, 100}) {
    expect_drawn(charts[0], step, alpha_loss(step), alpha_colour, "alpha");
    expect_drawn(charts[0], step, beta_loss(step), beta_colour, "beta");
  }
  for (int step : {0, 20, 80, 100}) {
    expect_drawn(charts[1], step, alpha_lr(step), alpha_colour, "alpha");
    expect_drawn(charts[1], step, beta_lr(step), beta_colour, "beta");
  }
  // And not where they are not: beta's colour is absent at alpha's points and vice versa.
  for (int step : {0, 70, 100}) {
    const auto [ax, ay] = screen(charts[0], step, alpha_loss(step));
    EXPECT_FALSE(colour_within(image, ax, ay, 2, beta_colour)) << "step " << step;
    const auto [bx, by] = screen(charts[0], step, beta_loss(step));
    EXPECT_FALSE(colour_within(image, bx, by, 2, alpha_colour)) << "step " << step;
  }

  // Each y tick label is drawn just left of the plot area, level with its grid line; a band
  // halfway between two ticks carries no text.
  for (const ReportChart& chart : charts) {
    const int label_right = int(kReportMargin + chart.layout.plot_left()) - 6;
    for (double v : chart.layout.y.values) {
      const int y = int(std::lround(chart.top + chart.layout.y_px(v)));
      EXPECT_GT(count_dark(image, label_right - 60, y - 7, label_right, y + 7), 12)
          << chart.metric << " label " << v << " near y " << y;
    }
    const double between = (chart.layout.y.values[0] + chart.layout.y.values[1]) / 2;
    const int y = int(std::lround(chart.top + chart.layout.y_px(between)));
    EXPECT_EQ(count_dark(image, label_right - 60, y - 3, label_right, y + 3), 0) << chart.metric;
  }
}

}  // namespace
}  // namespace ember::plot
