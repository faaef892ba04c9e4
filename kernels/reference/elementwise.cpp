#include "kernels/reference/elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ember::reference {
namespace {

constexpr double kPi = 3.14159265358979323846;

// NumPy broadcasting, written out independently of core/shape.
Shape broadcast_shape(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i + a.size() >= n ? a[i + a.size() - n] : 1;
    const int64_t db = i + b.size() >= n ? b[i + b.size() - n] : 1;
    EMBER_CHECK(da == db || da == 1 || db == 1, "reference: shapes ", a, " and ", b, " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Row-major successor of a multi-index (wraps to all zeros after the last element).
void next_index(Shape& idx, const Shape& shape) {
  for (size_t d = shape.size(); d-- > 0;) {
    if (++idx[d] < shape[d]) return;
    idx[d] = 0;
  }
}

double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}

}  // namespace

RefTensor elementwise_map(const RefTensor& x, const std::function<double(double)>& f) {
  RefTensor out(x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) out.data[size_t(i)] = f(x.data[size_t(i)]);
  return out;
}

RefTensor elementwise_zip(const RefTensor& a, const RefTensor& b, const std::function<double(double, double)>& f) {
  RefTensor out(broadcast_shape(a.shape, b.shape));
  Shape idx(out.shape.size(), 0);  // multi-index of element i, advanced like an odometer
  for (int64_t i = 0; i < out.numel(); ++i) {
    out.data[size_t(i)] = f(a.broadcast_at(idx, out.shape), b.broadcast_at(idx, out.shape));
    next_index(idx, out.shape);
  }
  return out;
}

RefTensor add(const RefTensor& a, const RefTensor& b, double alpha) {
  return elementwise_zip(a, b, [alpha](double x, double y) { return x + alpha * y; });
}
RefTensor sub(const RefTensor& a, const RefTensor& b, double alpha) {
  return elementwise_zip(a, b, [alpha](double x, double y) { return x - alpha * y; });
}
RefTensor mul(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return x * y; });
}
RefTensor div(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return x / y; });
}
RefTensor pow(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return std::pow(x, y); });
}
RefTensor pow(const RefTensor& a, double exponent) {
  return elementwise_map(a, [exponent](double x) { return std::pow(x, exponent); });
}
RefTensor maximum(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) {
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<double>::quiet_NaN();
    return x > y ? x : y;
  });
}
RefTensor minimum(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) {
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<double>::quiet_NaN();
    return x < y ? x : y;
  });
}

RefTensor neg(const RefTensor& x) { return elementwise_map(x, [](double v) { return -v; }); }
RefTensor exp(const RefTensor& x) { return elementwise_map(x, [](double v) { return std::exp(v); }); }
RefTensor log(const RefTensor& x) { return elementwise_map(x, [](double v) { return std::log(v); }); }
RefTensor sqrt(const RefTensor& x) { return elementwise_map(x, [](double v) { return std::sqrt(v); }); }
RefTensor rsqrt(const RefTensor& x) { return elementwise_map(x, [](double v) { return 1.0 / std::sqrt(v); }); }
RefTensor tanh(const RefTensor& x) { return elementwise_map(x, [](double v) { return std::tanh(v); }); }
RefTensor sigmoid(const RefTensor& x) {
  return elementwise_map(x, [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
}
RefTensor relu(const RefTensor& x) {
  return elementwise_map(x, [](double v) { return std::isnan(v) ? v : (v > 0.0 ? v : 0.0); });
}
RefTensor leaky_relu(const RefTensor& x, double negative_slope) {
  return elementwise_map(x, [negative_slope](double v) { return v > 0.0 ? v : negative_slope * v; });
}
RefTensor gelu(const RefTensor& x, bool tanh_approx) {
  return elementwise_map(x, tanh_approx ? gelu_tanh : gelu_erf);
}
RefTensor silu(const RefTensor& x) {
  return elementwise_map(x, [](double v) { return v / (1.0 + std::exp(-v)); });
}
RefTensor abs(const RefTensor& x) { return elementwise_map(x, [](double v) { return std::fabs(v); }); }
RefTensor clamp(const RefTensor& x, double min, double max) {
  return elementwise_map(x, [min, max](double v) {
    if (std::isnan(v)) return v;
    return std::min(std::max(v, min), max);
  });
}

RefTensor eq(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return x == y ? 1.0 : 0.0; });
}
RefTensor ne(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return x != y ? 1.0 : 0.0; });
}
RefTensor lt(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return x < y ? 1.0 : 0.0; });
}
RefTensor le(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return x <= y ? 1.0 : 0.0; });
}
RefTensor gt(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return x > y ? 1.0 : 0.0; });
}
RefTensor ge(const RefTensor& a, const RefTensor& b) {
  return elementwise_zip(a, b, [](double x, double y) { return x >= y ? 1.0 : 0.0; });
}

RefTensor where(const RefTensor& cond, const RefTensor& a, const RefTensor& b) {
  RefTensor out(broadcast_shape(cond.shape, broadcast_shape(a.shape, b.shape)));
  Shape idx(out.shape.size(), 0);
  for (int64_t i = 0; i < out.numel(); ++i) {
    out.data[size_t(i)] = cond.broadcast_at(idx, out.shape) != 0.0 ? a.broadcast_at(idx, out.shape)
                                                                    : b.broadcast_at(idx, out.shape);
    next_index(idx, out.shape);
  }
  return out;
}

RefTensor masked_fill(const RefTensor& x, const RefTensor& mask, double value) {
  RefTensor out(x.shape);
  Shape idx(out.shape.size(), 0);
  for (int64_t i = 0; i < out.numel(); ++i) {
    out.data[size_t(i)] = mask.broadcast_at(idx, out.shape) != 0.0 ? value : x.data[size_t(i)];
    next_index(idx, out.shape);
  }
  return out;
}

RefTensor unary_derivative(const std::string& op, const RefTensor& x, double p0, double p1) {
  std::function<double(double)> d;
  if (op == "neg") d = [](double) { return -1.0; };
  else if (op == "exp") d = [](double v) { return std::exp(v); };
  else if (op == "log") d = [](double v) { return 1.0 / v; };
  else if (op == "sqrt") d = [](double v) { return 0.5 / std::sqrt(v); };
  else if (op == "rsqrt") d = [](double v) { return -0.5 * std::pow(v, -1.5); };
  else if (op == "tanh") d = [](double v) { return 1.0 - std::tanh(v) * std::tanh(v); };
  else if (op == "sigmoid") d = [](double v) { const double s = 1.0 / (1.0 + std::exp(-v)); return s * (1.0 - s); };
  else if (op == "relu") d = [](double v) { return v > 0.0 ? 1.0 : 0.0; };
  else if (op == "leaky_relu") d = [p0](double v) { return v > 0.0 ? 1.0 : p0; };
  else if (op == "gelu")
    d = [](double v) { return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * kPi); };
  else if (op == "gelu_tanh")
    d = [](double v) {
      const double k = std::sqrt(2.0 / kPi), c = 0.044715;
      const double t = std::tanh(k * (v + c * v * v * v));
      return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * c * v * v);
    };
  else if (op == "silu")
    d = [](double v) {
      const double s = 1.0 / (1.0 + std::exp(-v));
      return s * (1.0 + v * (1.0 - s));
    };
  else if (op == "abs") d = [](double v) { return v > 0.0 ? 1.0 : (v < 0.0 ? -1.0 : 0.0); };
  else if (op == "pow") d = [p0](double v) { return p0 == 0.0 ? 0.0 : p0 * std::pow(v, p0 - 1.0); };
  else if (op == "clamp") d = [p0, p1](double v) { return v >= p0 && v <= p1 ? 1.0 : 0.0; };
  else EMBER_FAIL("reference::unary_derivative: unknown op ", op);
  return elementwise_map(x, d);
}

}  // namespace ember::reference
