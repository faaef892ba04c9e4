// conv1d, conv2d and conv_transpose2d: forward against the double-precision reference over a
// table of geometries (stride, padding numeric and "same"/"valid", dilation, groups,
// depthwise, bias, unbatched, non-contiguous, size-1 dims, 1x1 convolutions that skip im2col),
// in every float dtype; gradients against the reference's in f32 with one and two threads;
// each CPU path (im2col + GEMM, oneDNN's blocked kernels, the direct few-tap kernel) forced,
// and the automatic choice at each CPU capability; the AVX-512 kernels against the AVX2 ones,
// bit for bit;
// gradcheck in f64; autocast; errors that name the op and the shapes.
//
// Tolerances follow tests/ops/test_linalg.cpp: each output is a k-term dot product (k =
// Cg * kH * kW forward), checked within product_rel(dtype, k) * (|x| * |w|) elementwise,
// |x| * |w| being the same convolution of the magnitudes.
#include <iterator>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/native/convolution.h"
#include "kernels/cpu/convolution_path.h"
#include "kernels/reference/convolution.h"
#include "linalg_check.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::kFloatTypes;
using ember::testing::product_close;
using ember::testing::random_tensor;
using ember::testing::ref_abs;
using reference::ConvGeometry;
using reference::RefTensor;

namespace {

struct ConvCase {
  const char* name;
  Shape input, weight;  // input 4-D or 3-D (unbatched)
  Shape stride, padding, dilation;
  int64_t groups;
  bool bias;
  std::string named_padding = "";  // "same" / "valid" instead of `padding`
};

const ConvCase kCases[] = {
    {"plain", {2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {"no bias", {2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1, false},
    {"stride", {3, 2, 9, 8}, {5, 2, 3, 2}, {2, 3}, {0, 0}, {1, 1}, 1, true},
    {"padding", {2, 2, 5, 5}, {3, 2, 3, 3}, {1, 1}, {2, 1}, {1, 1}, 1, true},
    {"stride and padding", {2, 3, 8, 7}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, true},
    {"dilation", {2, 2, 9, 9}, {3, 2, 3, 2}, {1, 2}, {1, 0}, {2, 3}, 1, true},
    {"groups", {2, 6, 6, 5}, {4, 3, 2, 3}, {1, 1}, {1, 1}, {1, 1}, 2, true},
    {"depthwise", {2, 4, 6, 6}, {8, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 4, true},
    {"same odd kernel", {2, 3, 6, 5}, {2, 3, 3, 5}, {1, 1}, {}, {1, 1}, 1, true, "same"},
    {"same even kernel", {2, 3, 6, 5}, {2, 3, 4, 2}, {1, 1}, {}, {1, 1}, 1, true, "same"},
    {"same dilated even", {1, 2, 7, 7}, {2, 2, 2, 4}, {1, 1}, {}, {3, 1}, 1, false, "same"},
    {"valid", {2, 2, 5, 4}, {3, 2, 2, 2}, {1, 1}, {}, {1, 1}, 1, true, "valid"},
    {"unbatched", {3, 6, 5}, {2, 3, 3, 3}, {2, 1}, {1, 1}, {1, 1}, 1, true},
    {"1x1 direct", {3, 4, 5, 6}, {6, 4, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {"1x1 grouped direct", {2, 4, 3, 3}, {6, 2, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 2, false},
    {"1x1 stride 2", {2, 4, 7, 6}, {3, 4, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, true},
    {"1x1 padded", {2, 2, 3, 3}, {3, 2, 1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"size-1 dims", {1, 1, 1, 5}, {1, 1, 1, 3}, {1, 1}, {0, 1}, {1, 1}, 1, true},
    {"padding taller than the input", {2, 2, 1, 4}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"kernel equals padded input", {2, 2, 3, 3}, {2, 2, 5, 5}, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"batch of one", {1, 3, 10, 10}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
};

// The reference's geometry for a case: "same" splits d * (k - 1) with the extra at the end.
ConvGeometry geometry_of(const ConvCase& c) {
  ConvGeometry g{c.stride, {0, 0}, {0, 0}, c.dilation, c.groups};
  if (c.named_padding == "same") {
    for (size_t i = 0; i < 2; ++i) {
      const int64_t total = c.dilation[i] * (c.weight[2 + i] - 1);
      g.padding_begin[i] = total / 2;
      g.padding_end[i] = total - total / 2;
    }
  } else if (c.named_padding.empty()) {
    g.padding_begin = g.padding_end = c.padding;
  }
  return g;
}

Tensor run_conv2d(const ConvCase& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  if (c.named_padding.empty()) return conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
  return conv2d(x, w, b, c.stride, c.named_padding, c.dilation, c.groups);
}

int64_t taps(const Shape& weight) { return weight[1] * weight[2] * weight[3]; }

struct ForcedConvPath {
  explicit ForcedConvPath(cpu::ConvPath path) { cpu::set_conv_path(path); }
  ~ForcedConvPath() { cpu::set_conv_path(std::nullopt); }
};

struct Capability {
  explicit Capability(CpuCapability c) : saved(cpu_capability()) { set_cpu_capability(c); }
  ~Capability() { set_cpu_capability(saved); }
  CpuCapability saved;
};

struct ThreadCount {
  explicit ThreadCount(int n) : saved(get_num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved); }
  int saved;
};

}  // namespace

// ---- forward

void expect_forward_matches_reference(const ConvCase& c, DType dt, bool strided) {
  const Tensor x = random_tensor(c.input, dt, strided), w = random_tensor(c.weight, dt, strided);
  const Tensor b = c.bias ? random_tensor({c.weight[0]}, dt) : Tensor();
  const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w);
  const RefTensor rb = c.bias ? reference::from_tensor(b) : RefTensor();
  const ConvGeometry g = geometry_of(c);
  const RefTensor want = reference::conv2d(rx, rw, rb, c.bias, g);
  const RefTensor scale = reference::conv2d(ref_abs(rx), ref_abs(rw), c.bias ? ref_abs(rb) : rb, c.bias, g);
  EXPECT_TRUE(product_close(run_conv2d(c, x, w, b), want, scale, dt, taps(c.weight))) << dt;
}

TEST(Conv2d, EveryCaseAndDtypeMatchesReference) {
  for (const ConvCase& c : kCases)
    for (DType dt : kFloatTypes)
      for (bool strided : {false, true}) {
        SCOPED_TRACE(std::string(c.name) + (strided ? " non-contiguous" : ""));
        expect_forward_matches_reference(c, dt, strided);
      }
}

TEST(Conv2d, SamePaddingKeepsTheInputSize) {
  for (int64_t k : {1, 2, 3, 4, 5})
    EXPECT_EQ(conv2d(ones({1, 1, 6, 7}), ones({1, 1, k, k}), Tensor(), {1, 1}, "same").shape(), (Shape{1, 1, 6, 7}));
  EXPECT_EQ(conv2d(ones({1, 1, 6, 7}), ones({1, 1, 3, 3}), Tensor(), {1, 1}, "valid").shape(), (Shape{1, 1, 4, 5}));
}

TEST(Conv2d, EmptyBatch) {
  const Tensor y = conv2d(zeros({0, 2, 4, 4}), ones({3, 2, 3, 3}), ones({3}));
  EXPECT_EQ(y.shape(), (Shape{0, 3, 2, 2}));
}

TEST(Conv1d, MatchesReference) {
  struct Case1d {
    Shape input, weight;
    int64_t stride, padding, dilation, groups;
    std::string named;
  };
  const Case1d cases[] = {{{2, 3, 9}, {4, 3, 3}, 1, 0, 1, 1, ""},   {{2, 4, 11}, {6, 2, 4}, 2, 3, 2, 2, ""},
                          {{3, 7}, {2, 3, 2}, 1, 1, 1, 1, ""},      {{2, 3, 8}, {3, 3, 4}, 1, 0, 2, 1, "same"},
                          {{2, 3, 8}, {3, 3, 3}, 1, 0, 1, 1, "same"}, {{2, 3, 8}, {3, 1, 3}, 3, 0, 1, 3, "valid"}};
  for (const Case1d& c : cases)
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(shape_str(c.input) + " * " + shape_str(c.weight) + " " + c.named);
      const Tensor x = random_tensor(c.input, dt, true), w = random_tensor(c.weight, dt), b = random_tensor({c.weight[0]}, dt);
      int64_t pb = c.padding, pe = c.padding;
      if (c.named == "valid") pb = pe = 0;
      if (c.named == "same") {
        const int64_t total = c.dilation * (c.weight[2] - 1);
        pb = total / 2;
        pe = total - pb;
      }
      const Tensor got = c.named.empty() ? conv1d(x, w, b, c.stride, c.padding, c.dilation, c.groups)
                                         : conv1d(x, w, b, c.stride, c.named, c.dilation, c.groups);
      const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rb = reference::from_tensor(b);
      const RefTensor want = reference::conv1d(rx, rw, rb, true, c.stride, pb, pe, c.dilation, c.groups);
      const RefTensor scale =
          reference::conv1d(ref_abs(rx), ref_abs(rw), ref_abs(rb), true, c.stride, pb, pe, c.dilation, c.groups);
      EXPECT_TRUE(product_close(got, want, scale, dt, c.weight[1] * c.weight[2])) << dt;
    }
}

struct TransposeCase {
  Shape input, weight, stride, padding, output_padding, dilation;
  int64_t groups;
};

void expect_transpose_matches_reference(const TransposeCase& c, DType dt) {
  SCOPED_TRACE(shape_str(c.input) + " * " + shape_str(c.weight));
  const Tensor x = random_tensor(c.input, dt, true), w = random_tensor(c.weight, dt);
  const Tensor b = random_tensor({c.weight[1] * c.groups}, dt);
  const Tensor got = conv_transpose2d(x, w, b, c.stride, c.padding, c.output_padding, c.groups, c.dilation);
  const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rb = reference::from_tensor(b);
  const RefTensor want =
      reference::conv_transpose2d(rx, rw, rb, true, c.stride, c.padding, c.output_padding, c.groups, c.dilation);
  const RefTensor scale = reference::conv_transpose2d(ref_abs(rx), ref_abs(rw), ref_abs(rb), true, c.stride,
                                                      c.padding, c.output_padding, c.groups, c.dilation);
  const int64_t k = (c.weight[0] / c.groups) * c.weight[2] * c.weight[3];
  EXPECT_TRUE(product_close(got, want, scale, dt, k)) << dt;
}

TEST(ConvTranspose2d, MatchesReference) {
  const TransposeCase cases[] = {{{2, 3, 4, 5}, {3, 2, 3, 3}, {1, 1}, {0, 0}, {0, 0}, {1, 1}, 1},
                                 {{2, 4, 3, 4}, {4, 3, 3, 2}, {2, 3}, {1, 0}, {1, 2}, {1, 1}, 2},
                                 {{1, 2, 5, 5}, {2, 2, 2, 3}, {2, 1}, {0, 1}, {0, 1}, {2, 2}, 1},
                                 {{3, 4, 4}, {3, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1},
                                 {{2, 4, 3, 3}, {4, 1, 1, 1}, {1, 1}, {0, 0}, {0, 0}, {1, 1}, 4}};
  for (const TransposeCase& c : cases)
    for (DType dt : kFloatTypes) expect_transpose_matches_reference(c, dt);
}

// A strided or padded 1x1 transposed convolution is a gathered 1x1 convolution's input gradient
// with a bias (convolution_pointwise_input.cpp): the bias on the values and on the zeros between
// them, output padding past the last window (rows and columns no window reads), rows of output
// positions that fill a task's panels with a remainder, rows wider than a task, and rows a
// multiple of 8 wide (written in whole vectors past the cache).
TEST(ConvTranspose2d, GatheredOneByOneMatchesReferenceWithOneAndTwoThreads) {
  const TransposeCase cases[] = {{{2, 7, 5, 6}, {7, 5, 1, 1}, {2, 2}, {0, 0}, {1, 1}, {1, 1}, 1},
                                 {{1, 9, 4, 3}, {9, 4, 1, 1}, {2, 3}, {1, 1}, {0, 2}, {1, 1}, 1},
                                 {{3, 14, 15, 29}, {14, 9, 1, 1}, {2, 2}, {0, 0}, {1, 0}, {1, 1}, 1},
                                 {{1, 6, 2, 135}, {6, 3, 1, 1}, {2, 2}, {0, 0}, {0, 1}, {1, 1}, 1},
                                 {{2, 5, 6, 8}, {5, 4, 1, 1}, {2, 2}, {0, 0}, {1, 1}, {1, 1}, 1}};
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    for (const TransposeCase& c : cases) expect_transpose_matches_reference(c, DType::f32);
  }
}

// ---- backward

void expect_gradients_match_reference(const ConvCase& c) {
  const Tensor x = random_tensor(c.input).requires_grad_(), w = random_tensor(c.weight).requires_grad_();
  const Tensor b = random_tensor({c.weight[0]}).requires_grad_();
  const Tensor y = run_conv2d(c, x, w, b);
  const Tensor gy = random_tensor(y.shape(), DType::f32, true);
  y.backward(gy);
  const ConvGeometry g = geometry_of(c);
  const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rg = reference::from_tensor(gy);
  const auto want = reference::conv2d_backward(rx, rw, rg, g);
  const auto scale = reference::conv2d_backward(ref_abs(rx), ref_abs(rw), ref_abs(rg), g);
  const int64_t k_input = (c.weight[0] / c.groups) * c.weight[2] * c.weight[3];
  const int64_t k_weight = y.shape()[0] * y.shape()[2] * y.shape()[3];
  EXPECT_TRUE(product_close(x.grad(), want.input, scale.input, DType::f32, k_input));
  EXPECT_TRUE(product_close(w.grad(), want.weight, scale.weight, DType::f32, k_weight));
  EXPECT_TRUE(product_close(b.grad(), want.bias, scale.bias, DType::f32, k_weight));
}

TEST(Conv2d, GradientsMatchReferenceWithOneAndTwoThreads) {
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    for (const ConvCase& c : kCases) {
      if (c.input.size() != 4) continue;
      SCOPED_TRACE(std::string(c.name) + ", threads " + std::to_string(threads));
      expect_gradients_match_reference(c);
    }
  }
}

// Each CPU path forced (where oneDNN cannot run a case, such as groups > 1, it falls back to
// the GEMM), on the cases plus shapes with enough channels for the automatic choice to pick
// oneDNN, forward in f32 and bf16 (widened to f32) and gradients with one and two threads.
TEST(Conv2d, EveryCpuPathMatchesReference) {
  std::vector<ConvCase> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({"8 channels same", {3, 8, 7, 6}, {5, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true});
  cases.push_back({"8 channels stride 2", {2, 8, 9, 8}, {4, 8, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, false});
  cases.push_back({"8 channels dilated", {2, 8, 9, 9}, {3, 8, 3, 2}, {1, 1}, {2, 1}, {2, 3}, 1, true});
  cases.push_back({"8 channels stride leaves rows", {2, 8, 8, 8}, {4, 8, 3, 3}, {2, 2}, {0, 0}, {1, 1}, 1, true});
  cases.push_back({"8 channels groups 2", {2, 8, 6, 6}, {4, 4, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2, true});
  // oneDNN takes a thread's images about 1 MiB of them at a time (4 here: one thread runs a
  // chunk of 4 and one of 1, on the weight reordered once).
  cases.push_back({"4 channels chunks of images", {5, 4, 96, 96}, {2, 4, 1, 2}, {1, 1}, {0, 0}, {1, 1}, 1, true});
  // Shapes the direct kernel takes (few taps, at least 8 output positions): channel blocks of 3
  // with a remainder, a plane whose last 8-position chunk overlaps the one before. Rows not a
  // multiple of 8 wide read shifted copies in chunks that span rows; rows of 8 or 16 read a
  // padded copy row by row.
  cases.push_back({"1 channel 3x3 same", {3, 1, 10, 12}, {5, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true});
  cases.push_back({"1 channel 3x3 28 wide one image", {1, 1, 28, 28}, {8, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, false});
  cases.push_back({"1 channel 3x3 rows of 5", {2, 1, 3, 5}, {4, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true});
  // An output past 1 MiB with whole vectors of positions, written past the cache.
  cases.push_back({"1 channel 3x3 streamed", {11, 1, 28, 28}, {32, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true});
  cases.push_back({"1 channel 3x3 odd plane", {3, 1, 7, 9}, {2, 1, 3, 3}, {1, 1}, {0, 1}, {1, 1}, 1, false});
  cases.push_back({"1 channel 5x5 rows of 16", {2, 1, 20, 20}, {7, 1, 5, 5}, {1, 1}, {0, 0}, {1, 1}, 1, true});
  cases.push_back({"2 channels 3x3 rows of 8", {3, 2, 5, 8}, {4, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, false});
  cases.push_back({"1 channel 5x5 valid", {2, 1, 13, 16}, {6, 1, 5, 5}, {1, 1}, {0, 0}, {1, 1}, 1, false});
  cases.push_back({"1 channel dilated", {2, 1, 12, 13}, {4, 1, 3, 2}, {1, 1}, {2, 0}, {2, 3}, 1, true});
  cases.push_back({"2 channels narrow rows", {2, 2, 6, 11}, {7, 2, 3, 3}, {1, 1}, {0, 1}, {1, 1}, 1, true});
  cases.push_back({"1 channel asymmetric same", {2, 1, 9, 10}, {2, 1, 4, 4}, {1, 1}, {}, {1, 1}, 1, true, "same"});
  // 1x1 convolutions the GEMM path gathers into the micro-kernel's panels: output channels past
  // a multiple of 6, input channels past a multiple of 16, more output positions than one task
  // holds, padding with stride, three images. The weight gradient's tiles (4 output by 3 input
  // channels) with remainders, position counts not a multiple of 8, groups of images.
  cases.push_back({"1x1 stride 2 wide", {3, 20, 44, 46}, {13, 20, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, true});
  cases.push_back({"1x1 stride 2 3 padded", {2, 17, 9, 10}, {7, 17, 1, 1}, {2, 3}, {1, 2}, {1, 1}, 1, true});
  cases.push_back({"1x1 padded many channels", {2, 40, 5, 6}, {12, 40, 1, 1}, {1, 1}, {2, 1}, {1, 1}, 1, false});
  cases.push_back({"1x1 stride 2 padded odd", {1, 5, 11, 13}, {3, 5, 1, 1}, {2, 2}, {1, 1}, {1, 1}, 1, false});
  cases.push_back({"1x1 stride 2 256 channels", {1, 256, 34, 34}, {7, 256, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, false});
  // The input gradient's tasks of whole output rows: 4 rows of 29 positions (7 panels and a
  // partial one, the last task 3 rows), rows of 135 positions (one a task), input channels past a
  // multiple of 6.
  cases.push_back({"1x1 stride 2 rows of 29", {2, 9, 30, 58}, {14, 9, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, true});
  cases.push_back({"1x1 stride 2 rows of 135", {1, 3, 4, 270}, {5, 3, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, false});
  // Input rows a multiple of 8 wide, written in whole vectors past the cache: an odd row count
  // (the last row read by no window), an even one.
  cases.push_back({"1x1 stride 2 rows of 24", {2, 7, 9, 24}, {5, 7, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, true});
  cases.push_back({"1x1 stride 2 rows of 56", {3, 8, 12, 56}, {9, 8, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, false});
  // An output past 1 MiB in whole 16-position rows: the AVX-512 forward writes it past the cache.
  cases.push_back({"1x1 stride 2 streamed", {4, 16, 64, 64}, {72, 16, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, true});
  // Padding deeper than a task's rows: the first tasks own no input row.
  cases.push_back({"1x1 padded rows of 70", {1, 5, 7, 66}, {4, 5, 1, 1}, {1, 1}, {3, 2}, {1, 1}, 1, true});
  for (cpu::ConvPath path : {cpu::ConvPath::Gemm, cpu::ConvPath::OneDnn, cpu::ConvPath::Direct}) {
    ForcedConvPath forced(path);
    for (int threads : {1, 2}) {
      ThreadCount tc(threads);
      for (const ConvCase& c : cases) {
        SCOPED_TRACE(std::string(c.name) + ", " + cpu::conv_path_name(path) + ", threads " + std::to_string(threads));
        for (DType dt : {DType::f32, DType::bf16}) expect_forward_matches_reference(c, dt, false);
        if (c.input.size() == 4) expect_gradients_match_reference(c);
      }
    }
  }
}

// Forward and input gradient run image by image (or output block by output block) on every
// path, so the thread count changes no bit of them (the weight gradient sums per-thread
// partials, so it may): a 3x3 layer, a 1x1 stride-2 one (the GEMM path's gathered panels) and a
// one-channel one (the direct kernel).
TEST(Conv2d, ForwardAndInputGradientDoNotDependOnTheThreadCount) {
  struct Layer {
    Shape input, weight, stride, padding;
  };
  const Layer layers[] = {{{7, 8, 13, 11}, {5, 8, 3, 3}, {1, 1}, {1, 1}},
                          {{5, 20, 30, 29}, {13, 20, 1, 1}, {2, 2}, {0, 0}},
                          {{5, 1, 12, 14}, {7, 1, 5, 5}, {1, 1}, {2, 2}}};
  for (const Layer& l : layers)
    for (cpu::ConvPath path : {cpu::ConvPath::Gemm, cpu::ConvPath::OneDnn, cpu::ConvPath::Direct}) {
      SCOPED_TRACE(std::string(cpu::conv_path_name(path)) + ", " + std::to_string(l.weight[1]) + " channels");
      ForcedConvPath forced(path);
      const Tensor x = random_tensor(l.input), w = random_tensor(l.weight), b = random_tensor({l.weight[0]});
      Tensor y[2], dx[2];
      for (int threads : {1, 2}) {
        ThreadCount tc(threads);
        const Tensor xg = x.detach().requires_grad_();
        y[threads - 1] = conv2d(xg, w, b, l.stride, l.padding, {1, 1}, 1);
        y[threads - 1].sum().backward();
        dx[threads - 1] = xg.grad();
      }
      EXPECT_TRUE(all_close(y[1], y[0], 0, 0));
      EXPECT_TRUE(all_close(dx[1], dx[0], 0, 0));
    }
}

// Where the CPU has AVX-512 the choice differs in two places (convolution_path.h): the weight
// gradient goes to oneDNN at every width, and a one-channel layer's to the direct kernel's AVX-512
// tiles. Checked at both capabilities (the AVX-512 one only on a CPU that has it).
TEST(Conv2d, AutomaticCpuPathFollowsTheChannelCount) {
  const native::Conv2dParams p{{1, 1}, {1, 1}, {1, 1}, {1, 1}, 1};
  auto path = [&](cpu::ConvPass pass, int64_t channels, bool bias) {
    return cpu::conv_path_for(pass, {8, channels, 14, 14}, {16, channels, 3, 3}, {8, 16, 14, 14}, p, bias);
  };
  for (CpuCapability capability : {CpuCapability::Avx2, CpuCapability::Avx512}) {
    Capability at(capability);
    if (cpu_capability() != capability) continue;
    const bool avx512 = capability == CpuCapability::Avx512;
    SCOPED_TRACE(cpu_capability_name(capability));
    const int64_t enough = cpu::kOneDnnMinChannels;
    EXPECT_EQ(path(cpu::ConvPass::Forward, enough, true), cpu::ConvPath::OneDnn);
    EXPECT_EQ(path(cpu::ConvPass::BackwardInput, enough, false), cpu::ConvPath::OneDnn);
    EXPECT_EQ(path(cpu::ConvPass::Forward, enough - 1, true), cpu::ConvPath::Gemm);
    EXPECT_EQ(path(cpu::ConvPass::BackwardWeight, enough, false), cpu::ConvPath::OneDnn);
    EXPECT_EQ(path(cpu::ConvPass::BackwardWeight, cpu::kOneDnnMaxWeightGradChannels + 1, false),
              avx512 ? cpu::ConvPath::OneDnn : cpu::ConvPath::Gemm);
    const native::Conv2dParams strided{{2, 2}, {0, 0}, {0, 0}, {1, 1}, 1};
    EXPECT_EQ(
        cpu::conv_path_for(cpu::ConvPass::Forward, {8, 64, 14, 14}, {16, 64, 1, 1}, {8, 16, 7, 7}, strided, false),
        cpu::ConvPath::Gemm);
    // conv_transpose2d's bias on the input gradient: the GEMM path adds it.
    EXPECT_EQ(path(cpu::ConvPass::BackwardInput, enough, true), cpu::ConvPath::Gemm);
    // A one-channel 5x5 layer's forward runs the direct kernel, its input
    // gradient the GEMM, its weight gradient the direct kernel's tiles with AVX-512, else the GEMM.
    const cpu::ConvPath weight_path = avx512 ? cpu::ConvPath::Direct : cpu::ConvPath::Gemm;
    const native::Conv2dParams valid{{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1};
    const Shape x1{8, 1, 28, 28}, w1{6, 1, 5, 5}, y1{8, 6, 24, 24};
    EXPECT_EQ(cpu::conv_path_for(cpu::ConvPass::Forward, x1, w1, y1, valid, true), cpu::ConvPath::Direct);
    EXPECT_EQ(cpu::conv_path_for(cpu::ConvPass::BackwardInput, x1, w1, y1, valid, false), cpu::ConvPath::Gemm);
    EXPECT_EQ(cpu::conv_path_for(cpu::ConvPass::BackwardWeight, x1, w1, y1, valid, false), weight_path);
    // So does a one-channel 3x3 layer's.
    const Shape x3{8, 1, 28, 28}, w3{32, 1, 3, 3}, y3{8, 32, 28, 28};
    EXPECT_EQ(cpu::conv_path_for(cpu::ConvPass::Forward, x3, w3, y3, p, true), cpu::ConvPath::Direct);
    EXPECT_EQ(cpu::conv_path_for(cpu::ConvPass::BackwardWeight, x3, w3, y3, p, false), weight_path);
    {
      ForcedConvPath forced(cpu::ConvPath::OneDnn);
      EXPECT_EQ(path(cpu::ConvPass::Forward, 1, false), cpu::ConvPath::OneDnn);
      EXPECT_EQ(path(cpu::ConvPass::BackwardWeight, 1, false), cpu::ConvPath::OneDnn);
      EXPECT_EQ(path(cpu::ConvPass::BackwardInput, enough, true), cpu::ConvPath::Gemm);  // not supported there
    }
    ForcedConvPath forced(cpu::ConvPath::Direct);
    EXPECT_EQ(path(cpu::ConvPass::Forward, 1, false), cpu::ConvPath::Direct);
    EXPECT_EQ(path(cpu::ConvPass::BackwardInput, 1, false), cpu::ConvPath::Gemm);  // forward and weight only
    EXPECT_EQ(path(cpu::ConvPass::BackwardWeight, 1, false), weight_path);
    EXPECT_EQ(path(cpu::ConvPass::Forward, 64, false), cpu::ConvPath::Gemm);  // too many taps
  }
}

// The AVX-512 kernels (the gathered 1x1 convolution's three passes, the direct forward kernel)
// compute every value by the AVX2 kernels' arithmetic, so the two capabilities give the same bits:
// on a CPU with AVX-512, each layer's forward and gradients at both, on the path that runs them at
// both (a 1x1 stride-2 layer whose output passes 1 MiB, written past the cache; a padded 1x1 layer
// with odd channel counts; a one-channel 3x3 layer on the direct kernel; a batch of one, which the
// 1x1 forward splits within the image; a 56-wide stride-2 layer whose input gradient streams lines
// straddling two rows and whose last row panels have 8 rows).
TEST(Conv2d, Avx512KernelsGiveTheAvx2Bits) {
  if (!cpu_features().avx512f) GTEST_SKIP() << "no AVX-512 on this CPU";
  struct Layer {
    Shape input, weight, stride, padding;
    cpu::ConvPath path;
    bool weight_grad;  // the weight gradient runs the same path at both
                       // capabilities
  };
  const Layer layers[] = {{{4, 16, 64, 64}, {72, 16, 1, 1}, {2, 2}, {0, 0}, cpu::ConvPath::Gemm, true},
                          {{3, 21, 9, 13}, {11, 21, 1, 1}, {2, 2}, {1, 2}, cpu::ConvPath::Gemm, true},
                          {{1, 40, 30, 29}, {13, 40, 1, 1}, {2, 2}, {0, 0}, cpu::ConvPath::Gemm, true},
                          {{2, 8, 56, 56}, {20, 8, 1, 1}, {2, 2}, {0, 0}, cpu::ConvPath::Gemm, true},
                          {{5, 1, 28, 28}, {7, 1, 3, 3}, {1, 1}, {1, 1}, cpu::ConvPath::Direct, false}};
  for (const Layer& l : layers)
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::to_string(l.weight[1]) + " channels, threads " + std::to_string(threads));
      ThreadCount tc(threads);
      ForcedConvPath forced(l.path);
      const Tensor x = random_tensor(l.input), w = random_tensor(l.weight), b = random_tensor({l.weight[0]});
      const Tensor gy = random_tensor(conv2d(x, w, b, l.stride, l.padding, {1, 1}, 1).shape());
      std::vector<float> results[2];
      for (CpuCapability capability : {CpuCapability::Avx2, CpuCapability::Avx512}) {
        Capability at(capability);
        const Tensor xg = x.detach().requires_grad_(), wg = w.detach().requires_grad_();
        const Tensor y = conv2d(xg, wg, b, l.stride, l.padding, {1, 1}, 1);
        y.backward(gy);
        std::vector<float>& r = results[capability == CpuCapability::Avx512];
        for (const Tensor& t : {y, xg.grad(), l.weight_grad ? wg.grad() : Tensor()})
          if (t.defined())
            for (float v : t.contiguous().to_vector<float>()) r.push_back(v);
      }
      EXPECT_EQ(results[0], results[1]);
    }
}

// The stride-2 1x1 input gradient as conv_transpose2d's forward, with the bias it adds to every dX
// value and zero: the AVX-512 rows (whole lines, 4- and 8-row panels) give the AVX2 bits.
TEST(ConvTranspose2d, Avx512PointwiseGivesTheAvx2Bits) {
  if (!cpu_features().avx512f) GTEST_SKIP() << "no AVX-512 on this CPU";
  ForcedConvPath forced(cpu::ConvPath::Gemm);
  for (int64_t out_channels : {16, 20, 13}) {
    SCOPED_TRACE(std::to_string(out_channels) + " output channels");
    const Tensor x = random_tensor({2, 24, 28, 28}), w = random_tensor({24, out_channels, 1, 1});
    const Tensor b = random_tensor({out_channels});
    std::vector<float> results[2];
    for (CpuCapability capability : {CpuCapability::Avx2, CpuCapability::Avx512}) {
      Capability at(capability);
      results[capability == CpuCapability::Avx512] =
          conv_transpose2d(x, w, b, {2, 2}, {0, 0}, {1, 1}, 1, {1, 1}).contiguous().to_vector<float>();
    }
    EXPECT_EQ(results[0], results[1]);
  }
}

TEST(Conv2d, GradcheckInF64) {
  const auto leaf = [](const Shape& s) { return random_tensor(s, DType::f64).requires_grad_(); };
  ember::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{conv2d(in[0], in[1], in[2], {2, 1}, {1, 2}, {2, 1}, 1)};
      },
      {leaf({2, 2, 6, 5}), leaf({3, 2, 2, 3}), leaf({3})});
  ember::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{conv2d(in[0], in[1], Tensor(), {1, 1}, "same", {1, 1}, 3)};
      },
      {leaf({3, 4, 5}), leaf({3, 1, 2, 4})});
  ember::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{conv2d(in[0], in[1], in[2])}; },
      {leaf({2, 4, 3, 3}), leaf({2, 4, 1, 1}), leaf({2})});
}

TEST(Conv1d, GradcheckInF64) {
  const auto leaf = [](const Shape& s) { return random_tensor(s, DType::f64).requires_grad_(); };
  ember::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{conv1d(in[0], in[1], in[2], 2, 1, 2)}; },
      {leaf({2, 3, 9}), leaf({2, 3, 3}), leaf({2})});
  ember::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{conv1d(in[0], in[1], Tensor(), 1, "same")}; },
      {leaf({2, 6}), leaf({3, 2, 4})});
}

TEST(ConvTranspose2d, GradcheckInF64) {
  const auto leaf = [](const Shape& s) { return random_tensor(s, DType::f64).requires_grad_(); };
  ember::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{conv_transpose2d(in[0], in[1], in[2], {2, 2}, {1, 0}, {1, 0}, 1, {1, 2})};
      },
      {leaf({2, 2, 3, 3}), leaf({2, 3, 3, 2}), leaf({3})});
  ember::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{conv_transpose2d(in[0], in[1], Tensor(), {1, 2}, {0, 0}, {0, 1}, 2)};
      },
      {leaf({4, 2, 3}), leaf({4, 1, 2, 2})});
  // output_padding 1 at stride 1 (allowed below dilation 2): the input gradient's convolution
  // would have a row and a column more than x.
  ember::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{conv_transpose2d(in[0], in[1], in[2], {1, 1}, {0, 0}, {1, 1}, 1, {2, 2})};
      },
      {leaf({1, 2, 3, 3}), leaf({2, 2, 2, 2}), leaf({2})});
}

// ---- mixed precision

TEST(Conv2d, AutocastComputesInTheLowerDtype) {
  const Tensor x = random_tensor({2, 3, 6, 6}), w = random_tensor({4, 3, 3, 3}).requires_grad_();
  const Tensor b = random_tensor({4});
  Tensor y;
  {
    AutocastGuard ac(DeviceType::CPU, DType::bf16);
    y = conv2d(x, w, b, {1, 1}, {1, 1});
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  const RefTensor want = reference::conv2d(reference::from_tensor(x.to(DType::bf16)),
                                           reference::from_tensor(w.detach().to(DType::bf16)),
                                           reference::from_tensor(b.to(DType::bf16)), true,
                                           {{1, 1}, {1, 1}, {1, 1}, {1, 1}, 1});
  const RefTensor scale = reference::conv2d(ref_abs(reference::from_tensor(x)), ref_abs(reference::from_tensor(w)),
                                            ref_abs(reference::from_tensor(b)), true, {{1, 1}, {1, 1}, {1, 1}, {1, 1}, 1});
  EXPECT_TRUE(product_close(y, want, scale, DType::bf16, 27));
  y.to(DType::f32).sum().backward();
  EXPECT_EQ(w.grad().dtype(), DType::f32);
}

// ---- errors

TEST(ConvolutionErrors, NameTheOpAndTheShapes) {
  EXPECT_EMBER_ERROR(conv2d(zeros({3, 2, 5}), zeros({4, 3, 3, 3}), Tensor(), {1, 1}, {0, 0}),
                     "conv2d", "kernel", "[4, 3, 3, 3]", "larger than the padded input", "[3, 2, 5]");
  EXPECT_EMBER_ERROR(conv2d(zeros({5, 5}), zeros({4, 3, 3, 3})), "conv2d", "3-D (unbatched) or 4-D", "[5, 5]");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3})), "conv2d", "4-D weight", "[4, 3, 3]");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 2, 3, 3})), "conv2d", "[1, 3, 5, 5]", "3 channels",
                     "[4, 2, 3, 3]", "groups=1", "expects 2");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 4, 5, 5}), zeros({3, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2),
                     "conv2d", "3 output channels", "not divisible by groups=2");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 0),
                     "conv2d", "groups must be positive");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 2, 2}), zeros({4, 3, 3, 3})), "conv2d", "larger than the padded input",
                     "[1, 3, 2, 2]");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), Tensor(), {1, 1}, {0, 0}, {3, 3}), "conv2d",
                     "dilated extent 7");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), Tensor(), {0, 1}), "conv2d",
                     "stride must be positive");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), Tensor(), {1, 1}, {-1, 0}), "conv2d",
                     "padding must be non-negative");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), Tensor(), {1, 2, 3}), "conv2d",
                     "stride must have 1 or 2 values");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), Tensor(), {2, 2}, "same"), "conv2d",
                     "\"same\" needs stride 1");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), Tensor(), {1, 1}, "full"), "conv2d",
                     "\"same\" or \"valid\"", "\"full\"");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), zeros({3})), "conv2d", "bias of shape [3]",
                     "expected [4]");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}, {DType::f64})), "conv2d", "same dtype",
                     "float32", "float64");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}), zeros({4, 3, 3, 3}), zeros({4}, {DType::f64})), "conv2d",
                     "bias must have the input's dtype");
  EXPECT_EMBER_ERROR(conv2d(zeros({1, 3, 5, 5}, {DType::i64}), zeros({4, 3, 3, 3}, {DType::i64})), "conv2d",
                     "floating-point", "int64");
  EXPECT_EMBER_ERROR(conv2d(Tensor(), zeros({4, 3, 3, 3})), "conv2d", "undefined");

  EXPECT_EMBER_ERROR(conv1d(zeros({1, 3, 5, 5}), zeros({4, 3, 3})), "conv1d", "2-D (unbatched) or 3-D",
                     "[1, 3, 5, 5]");
  EXPECT_EMBER_ERROR(conv1d(zeros({1, 3, 2}), zeros({4, 3, 3})), "conv1d", "larger than the padded input");
  EXPECT_EMBER_ERROR(conv1d(zeros({1, 3, 8}), zeros({4, 3, 3}), Tensor(), 2, "same"), "conv1d",
                     "\"same\" needs stride 1", "[2]");

  EXPECT_EMBER_ERROR(conv_transpose2d(zeros({1, 3, 4, 4}), zeros({2, 2, 3, 3})), "conv_transpose2d",
                     "[1, 3, 4, 4]", "3 channels", "[2, 2, 3, 3]");
  EXPECT_EMBER_ERROR(conv_transpose2d(zeros({1, 3, 4, 4}), zeros({3, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {0, 0}, 2),
                     "conv_transpose2d", "not divisible by groups=2");
  EXPECT_EMBER_ERROR(conv_transpose2d(zeros({1, 2, 4, 4}), zeros({2, 2, 3, 3}), Tensor(), {2, 2}, {0, 0}, {2, 0}),
                     "conv_transpose2d", "output_padding [2, 0]", "stride [2, 2]", "dilation [1, 1]");
  EXPECT_EMBER_ERROR(conv_transpose2d(zeros({1, 2, 1, 1}), zeros({2, 2, 1, 1}), Tensor(), {1, 1}, {1, 1}),
                     "conv_transpose2d", "non-positive output size");
  EXPECT_EMBER_ERROR(conv_transpose2d(zeros({1, 2, 4, 4}), zeros({2, 3, 3, 3}), zeros({2})), "conv_transpose2d",
                     "bias of shape [2]", "expected [3]");
}
