#include "kernels/reference/pooling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

namespace ember::reference {
namespace {

Shape both(const Shape& v) { return v.size() == 1 ? Shape{v[0], v[0]} : v; }

// The input positions (ih, iw) of one output's window and the count it divides by.
struct Window {
  std::vector<std::pair<int64_t, int64_t>> cells;
  double divisor = 1.0;
};

// A pooling problem: the output size and, for each output, its window.
struct Pooling {
  int64_t out_h = 0, out_w = 0;
  std::function<Window(int64_t oh, int64_t ow)> window;
};

int64_t output_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const double span = double(in + 2 * p - d * (k - 1) - 1) / double(s);
  int64_t out = int64_t(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;  // the last window must start inside
  return out;
}

Pooling strided(const RefTensor& x, const PoolOptions& o, bool max) {
  const int64_t H = x.shape[x.shape.size() - 2], W = x.shape[x.shape.size() - 1];
  const Shape k = both(o.kernel_size), s = o.stride.empty() ? k : both(o.stride), p = both(o.padding);
  const Shape d = max ? both(o.dilation) : Shape{1, 1};
  Pooling r;
  r.out_h = output_size(H, k[0], s[0], p[0], d[0], o.ceil_mode);
  r.out_w = output_size(W, k[1], s[1], p[1], d[1], o.ceil_mode);
  r.window = [=](int64_t oh, int64_t ow) {
    Window w;
    for (int64_t kh = 0; kh < k[0]; ++kh)
      for (int64_t kw = 0; kw < k[1]; ++kw) {
        const int64_t ih = oh * s[0] - p[0] + kh * d[0], iw = ow * s[1] - p[1] + kw * d[1];
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) w.cells.push_back({ih, iw});
      }
    // the padded window, cut at the padded input's end (ceil mode may overhang it)
    const int64_t h0 = oh * s[0] - p[0], w0 = ow * s[1] - p[1];
    const int64_t padded = (std::min(h0 + k[0], H + p[0]) - h0) * (std::min(w0 + k[1], W + p[1]) - w0);
    w.divisor = o.count_include_pad ? double(padded) : double(w.cells.size());
    return w;
  };
  return r;
}

Pooling adaptive(const RefTensor& x, const Shape& output_size) {
  const int64_t H = x.shape[x.shape.size() - 2], W = x.shape[x.shape.size() - 1];
  const Shape out = both(output_size);
  Pooling r;
  r.out_h = out[0];
  r.out_w = out[1];
  r.window = [=](int64_t oh, int64_t ow) {
    const auto lo = [](int64_t i, int64_t n, int64_t m) { return int64_t(std::floor(double(i * n) / double(m))); };
    const auto hi = [](int64_t i, int64_t n, int64_t m) { return int64_t(std::ceil(double((i + 1) * n) / double(m))); };
    Window w;
    for (int64_t ih = lo(oh, H, out[0]); ih < hi(oh, H, out[0]); ++ih)
      for (int64_t iw = lo(ow, W, out[1]); iw < hi(ow, W, out[1]); ++iw) w.cells.push_back({ih, iw});
    w.divisor = double(w.cells.size());
    return w;
  };
  return r;
}

Shape pooled_shape(const RefTensor& x, const Pooling& r) {
  Shape s = x.shape;
  s[s.size() - 2] = r.out_h;
  s[s.size() - 1] = r.out_w;
  return s;
}

int64_t planes_of(const RefTensor& x) {
  return x.numel() / (x.shape[x.shape.size() - 2] * x.shape[x.shape.size() - 1]);
}

// The window cell holding the maximum: a strictly greater value or any NaN takes it, so ties
// keep the first and the last NaN wins (PyTorch's scan).
std::pair<int64_t, int64_t> argmax_cell(const RefTensor& x, int64_t plane, const Window& w) {
  const int64_t H = x.shape[x.shape.size() - 2], W = x.shape[x.shape.size() - 1];
  EMBER_CHECK(!w.cells.empty(), "reference::max_pool2d: a window holds no input");
  double best = -std::numeric_limits<double>::infinity();
  std::pair<int64_t, int64_t> at = w.cells.front();
  for (const auto& c : w.cells) {
    const double v = x.data[size_t(plane * H * W + c.first * W + c.second)];
    if (v > best || std::isnan(v)) {
      best = v;
      at = c;
    }
  }
  return at;
}

// Runs fn(plane, oh, ow, flat output index, window) for every output.
template <typename F>
void for_each_output(const RefTensor& x, const Pooling& r, const F& fn) {
  int64_t flat = 0;
  for (int64_t plane = 0; plane < planes_of(x); ++plane)
    for (int64_t oh = 0; oh < r.out_h; ++oh)
      for (int64_t ow = 0; ow < r.out_w; ++ow) fn(plane, r.window(oh, ow), flat++);
}

RefTensor max_forward(const RefTensor& x, const Pooling& r) {
  RefTensor out(pooled_shape(x, r));
  const int64_t H = x.shape[x.shape.size() - 2], W = x.shape[x.shape.size() - 1];
  for_each_output(x, r, [&](int64_t plane, const Window& w, int64_t flat) {
    const auto c = argmax_cell(x, plane, w);
    out.data[size_t(flat)] = x.data[size_t(plane * H * W + c.first * W + c.second)];
  });
  return out;
}

RefTensor max_backward(const RefTensor& x, const RefTensor& grad_out, const Pooling& r) {
  RefTensor gin(x.shape);
  const int64_t H = x.shape[x.shape.size() - 2], W = x.shape[x.shape.size() - 1];
  for_each_output(x, r, [&](int64_t plane, const Window& w, int64_t flat) {
    const auto c = argmax_cell(x, plane, w);
    gin.data[size_t(plane * H * W + c.first * W + c.second)] += grad_out.data[size_t(flat)];
  });
  return gin;
}

RefTensor avg_forward(const RefTensor& x, const Pooling& r) {
  RefTensor out(pooled_shape(x, r));
  const int64_t H = x.shape[x.shape.size() - 2], W = x.shape[x.shape.size() - 1];
  for_each_output(x, r, [&](int64_t plane, const Window& w, int64_t flat) {
    double sum = 0.0;
    for (const auto& c : w.cells) sum += x.data[size_t(plane * H * W + c.first * W + c.second)];
    out.data[size_t(flat)] = sum / w.divisor;
  });
  return out;
}

RefTensor avg_backward(const RefTensor& x, const RefTensor& grad_out, const Pooling& r) {
  RefTensor gin(x.shape);
  const int64_t H = x.shape[x.shape.size() - 2], W = x.shape[x.shape.size() - 1];
  for_each_output(x, r, [&](int64_t plane, const Window& w, int64_t flat) {
    for (const auto& c : w.cells)
      gin.data[size_t(plane * H * W + c.first * W + c.second)] += grad_out.data[size_t(flat)] / w.divisor;
  });
  return gin;
}

}  // namespace

RefTensor max_pool2d(const RefTensor& x, const PoolOptions& o) { return max_forward(x, strided(x, o, true)); }
RefTensor max_pool2d_backward(const RefTensor& x, const RefTensor& grad_out, const PoolOptions& o) {
  return max_backward(x, grad_out, strided(x, o, true));
}
RefTensor avg_pool2d(const RefTensor& x, const PoolOptions& o) { return avg_forward(x, strided(x, o, false)); }
RefTensor avg_pool2d_backward(const RefTensor& x, const RefTensor& grad_out, const PoolOptions& o) {
  return avg_backward(x, grad_out, strided(x, o, false));
}
RefTensor adaptive_avg_pool2d(const RefTensor& x, const Shape& output_size) {
  return avg_forward(x, adaptive(x, output_size));
}
RefTensor adaptive_avg_pool2d_backward(const RefTensor& x, const RefTensor& grad_out, const Shape& output_size) {
  return avg_backward(x, grad_out, adaptive(x, output_size));
}

}  // namespace ember::reference
