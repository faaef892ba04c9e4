// CUDA cat, index_select, index_add, gather, scatter_add, one_hot, embedding and its backward
// against the double reference, through the public native:: functions and, with outputs
// poisoned beforehand (NaN, or a sentinel for integers), through the stubs. Every dtype, both
// index dtypes, repeated indices, non-contiguous and misaligned inputs, odd row lengths and
// rows longer than a block. The accumulating ops (index_add, scatter_add, embedding backward)
// must match the CPU kernel bit for bit (embedding backward while no row is used more than
// its serial chunk) and give the same bits on a second run. Bad indices
// raise the CPU's message. Every test skips without a CUDA device.
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/indexing.h"
#include "core/native/nn_functional.h"
#include "kernels/reference/indexing.h"
#include "kernels/reference/nn_functional.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::same_bytes;
using ember::testing::coin;
using ember::testing::random_shape;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using reference::from_tensor;
using reference::RefTensor;

namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kIntPoison = -777.0;

constexpr std::array<DType, 7> kAllTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                            DType::i32, DType::i64, DType::boolean};
constexpr std::array<DType, 2> kIndexTypes = {DType::i64, DType::i32};

// Random values of `dt` on the GPU: floats in [-2, 2), integers in [-50, 50), bools 0/1.
// non_contiguous: every other element along the last dim of a device buffer.
Tensor gpu_data(const Shape& shape, DType dt, bool non_contiguous = false) {
  Shape big = shape;
  const bool strided = non_contiguous && !big.empty();
  if (strided) big.back() *= 2;
  Tensor t;
  if (dt == DType::boolean) {
    t = ember::testing::random_index(big, 2).to(dt);
  } else if (is_floating(dt)) {
    t = ember::testing::random_tensor(big, dt);
  } else {
    t = ember::testing::random_tensor(big, DType::f64, false, -50.0, 50.0).to(dt);
  }
  t = t.to(kGpu);
  if (strided) t = t.slice(-1, 0, big.back(), 2);
  return t;
}

// Uses of a row summed serially by one thread in the CUDA embedding backward (its chunk).
constexpr int64_t kSerialRun = 64;

// The most times any one row appears in `index`.
int64_t longest_run(const Tensor& index) {
  std::map<int64_t, int64_t> uses;
  int64_t most = 0;
  for (int64_t v : index.to(kCpu).contiguous().to(DType::i64).to_vector<int64_t>()) most = std::max(most, ++uses[v]);
  return most;
}

// Indices in [0, high) on the GPU, optionally a strided view as gpu_data.
Tensor gpu_index(const Shape& shape, int64_t high, DType dt, bool non_contiguous = false) {
  Shape big = shape;
  const bool strided = non_contiguous && !big.empty();
  if (strided) big.back() *= 2;
  Tensor t = ember::testing::random_index(big, high, dt).to(kGpu);
  if (strided) t = t.slice(-1, 0, big.back(), 2);
  return t;
}

// A contiguous GPU tensor that starts one row into a bigger buffer (pointer not 16-aligned
// for most row sizes).
Tensor offset_rows(const Shape& shape, DType dt) {
  Shape big = shape;
  big[0] += 1;
  return gpu_data(big, dt).slice(0, 1, big[0]);
}

Tensor poisoned(const Shape& shape, DType dt) { return full(shape, is_floating(dt) ? kNaN : kIntPoison, {dt, kGpu}); }

std::string label(const char* what, DType dt, const Shape& shape, int64_t dim, DType it = DType::i64) {
  return std::string(what) + " " + dtype_name(dt) + " " + shape_str(shape) + " dim " + std::to_string(dim) +
         " index " + dtype_name(it);
}

// Tolerance for sums of up to `terms` values of magnitude < 2 in `dt` (16-bit types round
// after every addition in index_add / scatter_add).
double sum_tolerance(DType dt, int64_t terms) { return tolerance(dt) * 4.0 * double(terms > 1 ? terms : 1); }

}  // namespace

// ---- cat

TEST(CudaIndexing, CatMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  struct Case {
    Shape base;
    int64_t dim;
    std::vector<int64_t> sizes;
  };
  std::vector<Case> cases = {
      {{3, 0}, 1, {4, 4}},         // f32: 16-byte rows
      {{5, 0}, 1, {3, 2, 1}},      // odd rows: narrow words
      {{0, 7}, 0, {1, 2000}},      // long rows, more than one block
      {{2, 3, 0}, 2, {1, 1, 1}},   // many outer slices, one element each
      {{0}, 0, {5, 0, 3}},         // 1-D with an empty part
      {{2, 0, 3, 2}, 1, {2, 3}},   // inner of 6 after the cat dim
  };
  for (int k = 0; k < 6; ++k) {
    const int nd = int(uniform_int(1, 4));
    Case c{random_shape(nd, 5), uniform_int(0, nd - 1), {}};
    const int parts = int(uniform_int(1, 4));
    for (int p = 0; p < parts; ++p) c.sizes.push_back(uniform_int(0, 4));
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    for (DType dt : kAllTypes) {
      Shape out_shape = c.base;
      out_shape[size_t(c.dim)] = 0;
      std::vector<Tensor> xs;
      std::vector<RefTensor> rs;
      for (int64_t s : c.sizes) {
        Shape shape = c.base;
        shape[size_t(c.dim)] = s;
        out_shape[size_t(c.dim)] += s;
        xs.push_back(gpu_data(shape, dt, coin()));
        rs.push_back(from_tensor(xs.back()));
      }
      SCOPED_TRACE(label("cat", dt, out_shape, c.dim));
      const RefTensor want = reference::cat(rs, c.dim);
      EXPECT_TRUE(all_close(native::cat(xs, c.dim), want, 0, 0));
      if (numel_of(out_shape) == 0) continue;
      std::vector<Tensor> nonempty;
      for (const Tensor& t : xs)
        if (t.numel() > 0) nonempty.push_back(t);
      const Tensor out = poisoned(out_shape, dt);
      native::cat_stub.call(kGpu, "cat")(out, nonempty, c.dim);
      EXPECT_TRUE(all_close(out, want, 0, 0));
    }
  }
}

TEST(CudaIndexing, CatMisalignedInputs) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (DType dt : {DType::f32, DType::f16, DType::boolean}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<Tensor> xs = {offset_rows({3, 8}, dt), offset_rows({3, 5}, dt), gpu_data({3, 8}, dt)};
    const Tensor out = poisoned({3, 21}, dt);
    native::cat_stub.call(kGpu, "cat")(out, xs, 1);
    EXPECT_TRUE(all_close(out, reference::cat({from_tensor(xs[0]), from_tensor(xs[1]), from_tensor(xs[2])}, 1), 0, 0));
  }
}

// ---- index_select

TEST(CudaIndexing, IndexSelectMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  struct Case {
    Shape shape;
    int64_t dim, m;
  };
  std::vector<Case> cases = {{{6, 8}, 0, 9},   {{7, 3}, 1, 5},     {{5, 1}, 0, 0},  {{3, 2000}, 0, 4},
                             {{2, 3, 5}, 1, 7}, {{4000}, 0, 3000}, {{1}, 0, 3},     {{2, 5, 3}, 2, 2}};
  for (int k = 0; k < 6; ++k) {
    const int nd = int(uniform_int(1, 4));
    cases.push_back({random_shape(nd, 6), uniform_int(0, nd - 1), uniform_int(0, 9)});
  }
  for (const Case& c : cases) {
    for (DType dt : kAllTypes) {
      for (DType it : kIndexTypes) {
        SCOPED_TRACE(label("index_select", dt, c.shape, c.dim, it));
        const int64_t n = c.shape[size_t(c.dim)];
        const Tensor x = gpu_data(c.shape, dt, coin());
        const Tensor idx = gpu_index({c.m}, n, it, coin());
        const RefTensor want = reference::index_select(from_tensor(x), c.dim, from_tensor(idx));
        EXPECT_TRUE(all_close(native::index_select(x, c.dim, idx), want, 0, 0));
        // The stub on a poisoned output, x starting one row into its buffer.
        const Tensor xo = offset_rows(c.shape, dt);
        const Tensor out = poisoned(want.shape, dt);
        native::index_select_stub.call(kGpu, "index_select")(out, xo, c.dim, idx.contiguous());
        EXPECT_TRUE(all_close(out, reference::index_select(from_tensor(xo), c.dim, from_tensor(idx)), 0, 0));
      }
    }
  }
}

// ---- index_add

TEST(CudaIndexing, IndexAddMatchesCpuAndReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  struct Case {
    Shape shape;
    int64_t dim, m, high;  // high: index values in [0, high), small for many repeats
  };
  std::vector<Case> cases = {{{6, 8}, 0, 9, 6},   {{7, 3}, 1, 12, 2},    {{5, 4}, 0, 0, 5},
                             {{3, 700}, 0, 40, 2}, {{2, 3, 5}, 1, 7, 3}, {{50}, 0, 3000, 3},
                             {{1}, 0, 5, 1},       {{40, 9}, 1, 600, 4}};
  for (int k = 0; k < 6; ++k) {
    const int nd = int(uniform_int(1, 4));
    const Shape shape = random_shape(nd, 6);
    const int64_t dim = uniform_int(0, nd - 1);
    cases.push_back({shape, dim, uniform_int(0, 12), coin() ? shape[size_t(dim)] : 1});
  }
  for (const Case& c : cases) {
    for (DType dt : kAllTypes) {
      for (DType it : kIndexTypes) {
        SCOPED_TRACE(label("index_add", dt, c.shape, c.dim, it) + " m " + std::to_string(c.m));
        Shape src_shape = c.shape;
        src_shape[size_t(c.dim)] = c.m;
        const Tensor x = gpu_data(c.shape, dt, coin());
        const Tensor src = gpu_data(src_shape, dt, coin());
        const Tensor idx = gpu_index({c.m}, c.high, it, coin());
        const Tensor out = native::index_add(x, c.dim, idx, src);
        const Tensor cpu = native::index_add(x.to(kCpu), c.dim, idx.to(kCpu), src.to(kCpu));
        EXPECT_TRUE(same_bytes(out, cpu));
        EXPECT_TRUE(same_bytes(native::index_add(x, c.dim, idx, src), out)) << "second run differs";
        if (dt != DType::boolean) {
          const double tol = sum_tolerance(dt, c.m);
          EXPECT_TRUE(all_close(out, reference::index_add(from_tensor(x), c.dim, from_tensor(idx), from_tensor(src)),
                                tolerance(dt), tol));
        }
      }
    }
  }
}

// ---- gather / scatter_add

namespace {

struct GatherCase {
  Shape x_shape, index_shape;
  int64_t dim;
};

std::vector<GatherCase> gather_cases() {
  std::vector<GatherCase> cases = {
      {{4, 6}, {4, 9}, 1},         // same outer and inner: no offset tables
      {{5, 6}, {3, 2}, 1},         // smaller outer
      {{5, 6}, {7, 4}, 0},         // smaller inner
      {{3, 4, 5}, {2, 6, 3}, 1},   // both tables
      {{3, 4, 5}, {3, 4, 1}, 2},   // last dim
      {{2000}, {3000}, 0},         // 1-D, long
      {{8, 300}, {600, 300}, 0},   // long inner rows, many repeats per destination
      {{1, 1}, {1, 4}, 1},
  };
  for (int k = 0; k < 6; ++k) {
    const int nd = int(uniform_int(1, 4));
    GatherCase c{random_shape(nd, 6), {}, uniform_int(0, nd - 1)};
    for (int64_t d = 0; d < nd; ++d)
      c.index_shape.push_back(d == c.dim ? uniform_int(0, 7) : uniform_int(1, c.x_shape[size_t(d)]));
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

TEST(CudaIndexing, GatherMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const GatherCase& c : gather_cases()) {
    for (DType dt : kAllTypes) {
      for (DType it : kIndexTypes) {
        SCOPED_TRACE(label("gather", dt, c.x_shape, c.dim, it) + " index shape " + shape_str(c.index_shape));
        const Tensor x = gpu_data(c.x_shape, dt, coin());
        const Tensor idx = gpu_index(c.index_shape, c.x_shape[size_t(c.dim)], it, coin());
        const RefTensor want = reference::gather(from_tensor(x), c.dim, from_tensor(idx));
        EXPECT_TRUE(all_close(native::gather(x, c.dim, idx), want, 0, 0));
        const Tensor out = poisoned(c.index_shape, dt);
        native::gather_stub.call(kGpu, "gather")(out, x.contiguous(), c.dim, idx.contiguous());
        EXPECT_TRUE(all_close(out, want, 0, 0));
      }
    }
  }
}

TEST(CudaIndexing, ScatterAddMatchesCpuAndReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const GatherCase& c : gather_cases()) {
    for (DType dt : kAllTypes) {
      for (DType it : kIndexTypes) {
        SCOPED_TRACE(label("scatter_add", dt, c.x_shape, c.dim, it) + " index shape " + shape_str(c.index_shape));
        // src may be larger than the index in every dim; only its leading part is used.
        Shape src_shape = c.index_shape;
        for (auto& s : src_shape) s += coin() ? 1 : 0;
        const Tensor x = gpu_data(c.x_shape, dt, coin());
        const Tensor idx = gpu_index(c.index_shape, c.x_shape[size_t(c.dim)], it, coin());
        const Tensor src = gpu_data(src_shape, dt, coin());
        const Tensor out = native::scatter_add(x, c.dim, idx, src);
        const Tensor cpu = native::scatter_add(x.to(kCpu), c.dim, idx.to(kCpu), src.to(kCpu));
        EXPECT_TRUE(same_bytes(out, cpu));
        EXPECT_TRUE(same_bytes(native::scatter_add(x, c.dim, idx, src), out)) << "second run differs";
        if (dt != DType::boolean) {
          const int64_t terms = c.index_shape[size_t(c.dim)];  // most a destination can get
          EXPECT_TRUE(all_close(
              out, reference::scatter_add(from_tensor(x), c.dim, from_tensor(idx), from_tensor(src)),
              tolerance(dt), sum_tolerance(dt, terms)));
        }
      }
    }
  }
}

// ---- one_hot

TEST(CudaIndexing, OneHotMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  std::vector<std::pair<Shape, int64_t>> cases = {{{}, 3}, {{5}, 1}, {{0}, 4}, {{4, 3}, 7}, {{3000}, 5}, {{2, 1, 3}, 2}};
  for (int k = 0; k < 4; ++k) cases.push_back({random_shape(int(uniform_int(1, 3)), 5), uniform_int(1, 9)});
  for (const auto& [shape, classes] : cases) {
    for (DType it : kIndexTypes) {
      SCOPED_TRACE("one_hot " + shape_str(shape) + " classes " + std::to_string(classes) + " " + dtype_name(it));
      const Tensor idx = gpu_index(shape, classes, it, coin());
      const RefTensor want = reference::one_hot(from_tensor(idx), classes);
      EXPECT_TRUE(all_close(native::one_hot(idx, classes), want, 0, 0));
      Shape out_shape = shape;
      out_shape.push_back(classes);
      const Tensor out = poisoned(out_shape, DType::i64);
      native::one_hot_stub.call(kGpu, "one_hot")(out, idx.contiguous(), classes);
      EXPECT_TRUE(all_close(out, want, 0, 0));
    }
  }
}

// ---- embedding

TEST(CudaEmbedding, ForwardMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  struct Case {
    int64_t num, dim;
    Shape index_shape;
  };
  std::vector<Case> cases = {{10, 4, {7}},     {10, 8, {3, 5}},    {6, 1, {9}},     {6, 3, {2, 2, 2}},
                             {5, 7, {0}},      {4, 1000, {6}},     {3, 33, {4000}}, {1, 16, {5}},
                             {12, 0, {3}},     {20, 2, {}}};
  for (int k = 0; k < 4; ++k)
    cases.push_back({uniform_int(1, 20), uniform_int(1, 40), random_shape(int(uniform_int(1, 3)), 6)});
  for (const Case& c : cases) {
    for (DType dt : kAllTypes) {
      for (DType it : kIndexTypes) {
        SCOPED_TRACE("embedding " + std::string(dtype_name(dt)) + " [" + std::to_string(c.num) + ", " +
                     std::to_string(c.dim) + "] indices " + shape_str(c.index_shape) + " " + dtype_name(it));
        const Tensor weight = gpu_data({c.num, c.dim}, dt, coin());
        const Tensor idx = gpu_index(c.index_shape, c.num, it, coin());
        const RefTensor want = reference::embedding(from_tensor(weight), from_tensor(idx));
        EXPECT_TRUE(all_close(native::embedding(weight, idx), want, 0, 0));
        // The stub on a poisoned output, the weight starting one row into its buffer.
        const Tensor w = offset_rows({c.num, c.dim}, dt);
        const int64_t n = numel_of(c.index_shape);
        const Tensor out = poisoned({n, c.dim}, dt);
        const Tensor flat = idx.contiguous().reshape({n});
        native::embedding_stub.call(kGpu, "embedding")(out, w, flat);
        EXPECT_TRUE(all_close(out, reference::embedding(from_tensor(w), from_tensor(flat)), 0, 0));
      }
    }
  }
}

TEST(CudaEmbedding, BackwardMatchesCpuAndReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  struct Case {
    int64_t num, dim;
    Shape index_shape;
    int64_t high;  // indices in [0, high)
  };
  std::vector<Case> cases = {{10, 4, {7}, 10},     {10, 8, {3, 5}, 3},   {6, 1, {9}, 6},      {6, 3, {2, 2, 2}, 2},
                             {4, 1000, {6}, 4},    {3, 33, {4000}, 3},   {1, 16, {5}, 1},     {50, 257, {300}, 50},
                             {7, 5, {1}, 7},       {20, 2, {}, 20}};
  for (int k = 0; k < 4; ++k) {
    const int64_t num = uniform_int(1, 20);
    cases.push_back({num, uniform_int(1, 40), random_shape(int(uniform_int(1, 3)), 6), uniform_int(1, num)});
  }
  for (const Case& c : cases) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (DType it : kIndexTypes) {
        for (int64_t padding : {int64_t(-1), uniform_int(0, c.num - 1)}) {
          SCOPED_TRACE("embedding_backward " + std::string(dtype_name(dt)) + " [" + std::to_string(c.num) + ", " +
                       std::to_string(c.dim) + "] indices " + shape_str(c.index_shape) + " " + dtype_name(it) +
                       " padding " + std::to_string(padding));
          Shape grad_shape = c.index_shape;
          grad_shape.push_back(c.dim);
          const Tensor idx = gpu_index(c.index_shape, c.high, it, coin());
          const Tensor grad = gpu_data(grad_shape, dt, coin());
          const Tensor gw = native::embedding_backward(grad, idx, c.num, padding);
          const Tensor cpu = native::embedding_backward(grad.to(kCpu), idx.to(kCpu), c.num, padding);
          // A row used up to kSerialRun times is summed in position order by one thread, as
          // on the CPU; longer runs are summed in chunks (compared with the reference only).
          if (longest_run(idx) <= kSerialRun) {
            EXPECT_TRUE(same_bytes(gw, cpu));
          }
          EXPECT_TRUE(same_bytes(native::embedding_backward(grad, idx, c.num, padding), gw)) << "second run differs";
          const RefTensor want = reference::embedding_backward(from_tensor(grad), from_tensor(idx), c.num, padding);
          const int64_t n = numel_of(c.index_shape);
          EXPECT_TRUE(all_close(gw, want, tolerance(dt), tolerance(dt) * double(n > 10 ? n : 10)));
          if (padding >= 0) {
            const RefTensor row = from_tensor(gw.select(0, padding));
            for (double v : row.data) EXPECT_EQ(v, 0.0) << "padding row written";
          }
        }
      }
    }
  }
}

// Every position of a long sequence reads row 0 (BERT's token types): one run spread over
// many chunks, beside runs of every length around the chunk size, in random order.
TEST(CudaEmbedding, BackwardOfLongRunsIsChunkedAndDeterministic) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  std::vector<int64_t> mixed;
  for (int64_t row = 0; row < 12; ++row) {
    const int64_t uses = row == 0 ? 1000 : uniform_int(1, 3 * kSerialRun);
    for (int64_t k = 0; k < uses; ++k) mixed.push_back(row);
  }
  std::shuffle(mixed.begin(), mixed.end(), ember::testing::rng());
  struct Case {
    std::vector<int64_t> index;
    int64_t num, dim;
  };
  const std::vector<Case> cases = {{std::vector<int64_t>(8192, 0), 2, 768}, {mixed, 12, 37}};
  for (const Case& c : cases) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (int64_t padding : {int64_t(-1), int64_t(1)}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + ", " + std::to_string(c.index.size()) + " indices into " +
                     std::to_string(c.num) + " rows of " + std::to_string(c.dim) + ", padding " +
                     std::to_string(padding));
        const Tensor idx = from_vector<int64_t>(c.index).to(kGpu);
        const Tensor grad = gpu_data({int64_t(c.index.size()), c.dim}, dt);
        const Tensor gw = native::embedding_backward(grad, idx, c.num, padding);
        EXPECT_TRUE(same_bytes(native::embedding_backward(grad, idx, c.num, padding), gw)) << "second run differs";
        const RefTensor want = reference::embedding_backward(from_tensor(grad), from_tensor(idx), c.num, padding);
        // chunk sums in the accumulation type, then the chunks in order: error grows with the chunk count
        const double n = double(c.index.size());
        EXPECT_TRUE(all_close(gw, want, tolerance(dt), tolerance(dt) * (8.0 + n / double(kSerialRun))));
        if (padding == 1) {
          const RefTensor pad = from_tensor(gw.select(0, 1));
          for (double v : pad.data) EXPECT_EQ(v, 0.0) << "padding row written";
        }
      }
    }
  }
}

// ---- bad indices

TEST(CudaIndexing, BadIndicesRaiseTheCpuMessage) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType it : kIndexTypes) {
    SCOPED_TRACE(dtype_name(it));
    const Tensor x = gpu_data({3, 5}, DType::f32);
    auto make_index = [&](const std::vector<int64_t>& v, const Shape& shape) {
      return from_vector(v, shape).to(it).to(kGpu);
    };
    // The first bad index is the one reported.
    EXPECT_EMBER_ERROR(native::index_select(x, 1, make_index({0, 7, 9, 2}, {4})),
                       "index_select: index 7 is out of range for dim 1 of size 5 (valid range [0, 5))");
    EXPECT_EMBER_ERROR(native::index_select(x, 0, make_index({-1}, {1})),
                       "index_select: index -1 is out of range for dim 0 of size 3 (valid range [0, 3))");
    EXPECT_EMBER_ERROR(native::index_add(x, 0, make_index({1, 3}, {2}), gpu_data({2, 5}, DType::f32)),
                       "index_add: index 3 is out of range for dim 0 of size 3 (valid range [0, 3))");
    EXPECT_EMBER_ERROR(native::gather(x, 1, make_index({0, 1, 2, 3, 4, 5, 0, 1, 2}, {3, 3})),
                       "gather: index 5 is out of range for dim 1 of size 5 (valid range [0, 5))");
    EXPECT_EMBER_ERROR(native::scatter_add(x, 0, make_index({0, 1, -2, 0}, {2, 2}), gpu_data({2, 2}, DType::f32)),
                       "scatter_add: index -2 is out of range for dim 0 of size 3 (valid range [0, 3))");
    EXPECT_EMBER_ERROR(native::one_hot(make_index({1, 0, 3}, {3}), 3),
                       "one_hot: class index 3 is out of range for 3 classes (valid range [0, 3))");
    EXPECT_EMBER_ERROR(native::embedding(gpu_data({4, 2}, DType::f32), make_index({0, 2, 4, 5}, {2, 2})),
                       "embedding: index 4 at position 2 is out of range for 4 embeddings (valid range [0, 4))");
    EXPECT_EMBER_ERROR(native::embedding_backward(gpu_data({3, 2}, DType::f32), make_index({1, -1, 0}, {3}), 2, -1),
                       "embedding: index -1 at position 1 is out of range for 2 embeddings (valid range [0, 2))");
    // No error is left behind: a valid call right after still works.
    const Tensor ok = make_index({2, 0}, {2});
    EXPECT_TRUE(all_close(native::index_select(x, 0, ok), reference::index_select(from_tensor(x), 0, from_tensor(ok)),
                          0, 0));
  }
}
