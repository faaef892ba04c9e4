// CUDA dropout, cross-entropy and bias + GELU, forward and backward. Dropout masks must equal
// the CPU kernel's bit for bit for the same generator state (odd sizes, unaligned views,
// extreme p); cross-entropy and bias + GELU are checked against the double reference for every
// float dtype, with ignore_index, label smoothing, each reduction, [N, C] and [N, C, d...]
// logits, bad targets, repeat runs for the deterministic sums, and a bias gradient over more
// row chunks than one grid dimension holds. Outputs start out poisoned
// (NaN, or the complement of the expected mask) so that an element never written shows. Every
// test skips without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/copy.h"
#include "core/native/fused.h"
#include "core/native/nn_functional.h"
#include "core/native/views.h"
#include "kernels/reference/fused.h"
#include "kernels/reference/nn_functional.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_index;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;

namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

DType compute_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

std::vector<uint8_t> mask_bytes(const Tensor& mask) {
  const Tensor m = native::contiguous(mask.to(kCpu));
  const bool* p = m.data_ptr<bool>();
  std::vector<uint8_t> out(size_t(m.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = p[i] ? 1 : 0;
  return out;
}

// Index of the first difference, or -1.
int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

GeneratorState random_state() {
  GeneratorState st;
  st.seed = uint64_t(uniform_int(0, int64_t(1) << 62));
  st.offset = uint64_t(uniform_int(0, 1000000));
  return st;
}

std::vector<int64_t> dropout_sizes() {
  std::vector<int64_t> sizes = {1, 2, 3, 4, 5, 7, 8, 9, 1023, 4099, 65537};
  for (int k = 0; k < 3; ++k) sizes.push_back(uniform_int(1, 5000));
  return sizes;
}

const std::vector<double> kDropoutP = {0.0, 1e-7, 0.1, 0.5, 0.9, 1.0 - 1.0 / 16777216.0, 1.0 - 1e-9};

}  // namespace

// ---- dropout

TEST(CudaDropout, StubMaskAndOutputMatchCpuBitForBit) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (int64_t n : dropout_sizes()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (double p : kDropoutP) {
        for (int64_t shift : {int64_t(0), int64_t(1)}) {  // 1: views off the vector alignment
          SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n) + " p " + std::to_string(p) +
                       " shift " + std::to_string(shift));
          const GeneratorState st = random_state();
          const double scale = 1.0 / (1.0 - p);
          const Tensor x_full = random_tensor({n + shift}, dt, false, -3.0, 3.0);
          const Tensor x = native::slice(x_full, 0, shift, n + shift, 1);
          const Tensor out_cpu = empty({n}, {dt, kCpu});
          const Tensor mask_cpu = empty({n}, {DType::boolean, kCpu});
          native::dropout_stub.call(kCpu, "dropout")(out_cpu, mask_cpu, native::contiguous(x), p, scale, st);

          const Tensor x_gpu = native::slice(x_full.to(kGpu), 0, shift, n + shift, 1);
          const Tensor out_full = full({n + shift}, kNaN, {dt, kGpu});
          const Tensor out_gpu = native::slice(out_full, 0, shift, n + shift, 1);
          // mask poisoned with the complement of the expected one
          std::vector<uint8_t> want = mask_bytes(mask_cpu);
          std::vector<int64_t> inverse(want.size());
          for (size_t i = 0; i < want.size(); ++i) inverse[i] = want[i] ? 0 : 1;
          const Tensor mask_gpu = from_vector(inverse, {n}).to(DType::boolean).to(kGpu);
          native::dropout_stub.call(kGpu, "dropout")(out_gpu, mask_gpu, x_gpu, p, scale, st);

          const int64_t diff = first_difference(mask_bytes(mask_gpu), want);
          EXPECT_EQ(diff, -1) << "masks differ first at element " << diff;
          EXPECT_TRUE(all_close(out_gpu, out_cpu, 0.0, 0.0));
          if (p == 0.0) {
            EXPECT_EQ(first_difference(want, std::vector<uint8_t>(want.size(), 1)), -1);
          }
        }
      }
    }
  }
}

TEST(CudaDropout, NativeDropoutMatchesCpuForEqualGenerators) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const uint64_t seed = uint64_t(uniform_int(0, 1000000000));
  Generator gen_cpu(seed), gen_gpu(seed);
  const int64_t skip = uniform_int(0, 99);  // an offset that is no multiple of 4
  gen_cpu.reserve(uint64_t(skip));
  gen_gpu.reserve(uint64_t(skip));
  for (const Shape& shape : {Shape{3, 5, 7}, Shape{1}, Shape{2, 1, 1}, Shape{33, 31}, Shape{(int64_t(1) << 21) + 5}}) {
    for (double p : {0.2, 0.5}) {
      SCOPED_TRACE(shape_str(shape) + " p " + std::to_string(p));
      const Tensor x = random_tensor(shape, DType::f32);
      const GeneratorState before = gen_gpu.get_state();
      const native::DropoutResult a = native::dropout(x, p, gen_cpu);
      const native::DropoutResult b = native::dropout(x.to(kGpu), p, gen_gpu);
      const std::vector<uint8_t> got = mask_bytes(b.mask);
      EXPECT_EQ(first_difference(got, mask_bytes(a.mask)), -1);
      EXPECT_TRUE(all_close(b.out, a.out, 0.0, 0.0));
      // and the reference's mask, written from the stream's definition
      const reference::RefTensor ref_mask = reference::dropout_mask(shape, p, before);
      std::vector<uint8_t> want(ref_mask.data.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = ref_mask.data[i] != 0.0 ? 1 : 0;
      EXPECT_EQ(first_difference(got, want), -1);
    }
  }
  EXPECT_EQ(gen_cpu.get_state().offset, gen_gpu.get_state().offset);
}

TEST(CudaDropout, BackwardMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (int64_t n : dropout_sizes()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (int64_t shift : {int64_t(0), int64_t(3)}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n) + " shift " + std::to_string(shift));
        const double p = 0.3, scale = 1.0 / (1.0 - p);
        const Tensor g_full = random_tensor({n + shift}, dt);
        const Tensor mask = random_index({n}, 2).to(DType::boolean);
        const Tensor want = empty({n}, {dt, kCpu});
        native::dropout_backward_stub.call(kCpu, "dropout_backward")(
            want, native::contiguous(native::slice(g_full, 0, shift, n + shift, 1)), mask, scale);
        const Tensor out_full = full({n + shift}, kNaN, {dt, kGpu});
        const Tensor out = native::slice(out_full, 0, shift, n + shift, 1);
        native::dropout_backward_stub.call(kGpu, "dropout_backward")(
            out, native::slice(g_full.to(kGpu), 0, shift, n + shift, 1), mask.to(kGpu), scale);
        EXPECT_TRUE(all_close(out, want, 0.0, 0.0));
      }
    }
  }
}

// ---- cross entropy

namespace {

struct CeCase {
  int64_t n, c, d;
};

std::vector<CeCase> ce_cases() {
  std::vector<CeCase> cases = {{1, 1, 1},  {5, 3, 1},   {7, 32, 1}, {4, 1024, 1}, {3, 1025, 1}, {2, 5000, 1},
                               {300, 10, 1}, {3, 5, 7}, {2, 4, 15}, {1, 1025, 2}, {4, 1, 3},    {0, 4, 1}};
  for (int k = 0; k < 3; ++k) cases.push_back({uniform_int(1, 20), uniform_int(1, 300), uniform_int(1, 6)});
  return cases;
}

// Random targets in [0, c), about a quarter of them ignore_index.
Tensor ce_target(int64_t n, int64_t d, int64_t c, int64_t ignore_index, DType dt) {
  std::vector<int64_t> v(size_t(n * d));
  for (auto& t : v) t = uniform_int(0, 3) == 0 ? ignore_index : uniform_int(0, c - 1);
  return from_vector(v, {n, d}).to(dt);
}

// Log-sum-exp of each (n, d) row of a [N, C, D] reference tensor; 0 for ignored rows.
reference::RefTensor reference_lse(const reference::RefTensor& x, const reference::RefTensor& target,
                                   int64_t ignore_index) {
  const int64_t n = x.shape[0], c = x.shape[1], d = x.shape[2];
  reference::RefTensor out({n, d});
  for (int64_t r = 0; r < n * d; ++r) {
    if (int64_t(target.data[size_t(r)]) == ignore_index) continue;
    const int64_t base = (r / d) * c * d + r % d;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < c; ++i) m = std::max(m, x.data[size_t(base + i * d)]);
    double s = 0;
    for (int64_t i = 0; i < c; ++i) s += std::exp(x.data[size_t(base + i * d)] - m);
    out.data[size_t(r)] = m + std::log(s);
  }
  return out;
}

// The default -100 most of the time, sometimes a valid class (which then counts as ignored).
int64_t coin_ignore_index(int64_t c) { return ember::testing::coin() ? -100 : uniform_int(0, c - 1); }

const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Mean ? "mean" : "sum";
}

}  // namespace

TEST(CudaCrossEntropy, ForwardAndBackwardMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const CeCase& k : ce_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        for (double eps : {0.0, 0.1}) {
          for (bool acc_loss : {false, true}) {
            const int64_t ignore_index = coin_ignore_index(k.c);
            const DType tdt = ember::testing::coin() ? DType::i64 : DType::i32;
            SCOPED_TRACE(std::string(dtype_name(dt)) + " [" + std::to_string(k.n) + ", " + std::to_string(k.c) +
                         ", " + std::to_string(k.d) + "] " + reduction_name(red) + " eps " + std::to_string(eps) +
                         (acc_loss ? " f32 loss" : "") + " ignore " + std::to_string(ignore_index) + " " +
                         dtype_name(tdt));
            native::CrossEntropyArgs args;
            args.ignore_index = ignore_index;
            args.label_smoothing = eps;
            args.reduction = red;
            args.accumulate_type_loss = acc_loss;
            const Tensor x = random_tensor({k.n, k.c, k.d}, dt, false, -4.0, 4.0);
            const Tensor t = ce_target(k.n, k.d, k.c, ignore_index, tdt);
            const DType cd = compute_dtype(dt);
            const DType loss_dt = acc_loss ? cd : dt;
            const Shape loss_shape = red == Reduction::None ? Shape{k.n, k.d} : Shape{};
            const Tensor loss = full(loss_shape, kNaN, {loss_dt, kGpu});
            const Tensor lse = full({k.n, k.d}, kNaN, {cd, kGpu});
            const Tensor xg = x.to(kGpu), tg = t.to(kGpu);
            const int64_t count = native::cross_entropy_stub.call(kGpu, "cross_entropy")(loss, lse, xg, tg, args);

            const reference::RefTensor rx = reference::from_tensor(x), rt = reference::from_tensor(t);
            int64_t want_count = 0;
            for (double v : rt.data) want_count += int64_t(v) != ignore_index ? 1 : 0;
            EXPECT_EQ(count, want_count);
            const double tol = tolerance(loss_dt);
            const reference::RefTensor want = reference::cross_entropy(rx, rt, ignore_index, eps, red);
            if (red == Reduction::Mean && want_count == 0) {
              EXPECT_TRUE(std::isnan(loss.to_vector<double>()[0]));
            } else {
              EXPECT_TRUE(all_close(loss, want, tol, 4 * tol));
            }
            EXPECT_TRUE(all_close(lse, reference_lse(rx, rt, ignore_index), tolerance(cd), 4 * tolerance(cd)));

            // backward from the kernel's own lse
            const Tensor gl = random_tensor(red == Reduction::None ? Shape{k.n * k.d} : Shape{1}, cd, false, 0.5, 2.0);
            const Tensor grad = full({k.n, k.c, k.d}, kNaN, {dt, kGpu});
            if (grad.numel() > 0)
              native::cross_entropy_backward_stub.call(kGpu, "cross_entropy_backward")(grad, gl.to(kGpu), xg, tg, lse,
                                                                                      args, count);
            reference::RefTensor rgl = reference::from_tensor(gl);
            if (red == Reduction::None) rgl.shape = {k.n, k.d};
            const reference::RefTensor want_grad =
                reference::cross_entropy_backward(rx, rt, rgl, ignore_index, eps, red);
            EXPECT_TRUE(all_close(grad, want_grad, tolerance(dt), tolerance(dt)));
          }
        }
      }
    }
  }
}

TEST(CudaCrossEntropy, NativeShapesMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  // [N, C], [N, C, d1, d2] and unbatched [C] through native::cross_entropy and its backward
  for (const Shape& shape : {Shape{6, 9}, Shape{2, 5, 3, 4}, Shape{3, 7, 1, 2}, Shape{11}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape));
      const int64_t c = shape.size() == 1 ? shape[0] : shape[1];
      Shape tshape;
      if (shape.size() > 1) {
        tshape.push_back(shape[0]);
        for (size_t k = 2; k < shape.size(); ++k) tshape.push_back(shape[k]);
      }
      native::CrossEntropyArgs args;
      args.label_smoothing = 0.05;
      args.accumulate_type_loss = true;
      const Tensor x = random_tensor(shape, dt, false, -3.0, 3.0);
      const Tensor t = random_index(tshape, c);
      const native::CrossEntropyResult r = native::cross_entropy(x.to(kGpu), t.to(kGpu), args);
      EXPECT_EQ(r.count, numel_of(tshape));
      EXPECT_EQ(r.loss.dtype(), DType::f32);
      const reference::RefTensor rx = reference::from_tensor(x), rt = reference::from_tensor(t);
      const reference::RefTensor want = reference::cross_entropy(rx, rt, -100, 0.05, Reduction::Mean);
      EXPECT_TRUE(all_close(r.loss, want, tolerance(DType::f32), 4 * tolerance(DType::f32)));
      const Tensor gl = full({}, 1.5, {DType::f32, kGpu});
      const Tensor grad = native::cross_entropy_backward(gl, r, shape, args);
      EXPECT_EQ(grad.shape(), shape);
      reference::RefTensor rgl(Shape{});
      rgl.data[0] = 1.5;
      const reference::RefTensor want_grad =
          reference::cross_entropy_backward(rx, rt, rgl, -100, 0.05, Reduction::Mean);
      EXPECT_TRUE(all_close(grad, want_grad, tolerance(dt), tolerance(dt)));
    }
  }
}

TEST(CudaCrossEntropy, AllIgnoredGivesZeroCount) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t d : {int64_t(1), int64_t(3)}) {
    const Tensor x = random_tensor({4, 5, d}, DType::f32).to(kGpu);
    const Tensor t = full({4, d}, -100.0, {DType::i64, kGpu});
    native::CrossEntropyArgs args;
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      args.reduction = red;
      const Tensor loss = full(red == Reduction::None ? Shape{4, d} : Shape{}, kNaN, {DType::f32, kGpu});
      const Tensor lse = full({4, d}, kNaN, {DType::f32, kGpu});
      EXPECT_EQ(native::cross_entropy_stub.call(kGpu, "cross_entropy")(loss, lse, x, t, args), 0);
      const std::vector<double> l = loss.to_vector<double>();
      if (red == Reduction::Mean) {
        EXPECT_TRUE(std::isnan(l[0]));  // 0 / 0, as on the CPU
      } else {
        for (double v : l) EXPECT_EQ(v, 0.0);
      }
      for (double v : lse.to_vector<double>()) EXPECT_EQ(v, 0.0);
    }
  }
}

TEST(CudaCrossEntropy, BadTargetRaises) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const Shape& shape : {Shape{4, 5}, Shape{2, 5, 3}, Shape{2, 2000}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t c = shape[1];
    Shape tshape{shape[0]};
    if (shape.size() == 3) tshape.push_back(shape[2]);
    const Tensor x = random_tensor(shape, DType::f32).to(kGpu);
    for (int64_t bad : {c, int64_t(-1), c + 7}) {
      std::vector<int64_t> v(size_t(numel_of(tshape)), 0);
      v[v.size() - 1] = bad;
      const Tensor t = from_vector(v, tshape).to(kGpu);
      const std::string what = "target " + std::to_string(bad) + " is out of bounds for " + std::to_string(c);
      EXPECT_EMBER_ERROR(native::cross_entropy(x, t, {}), "cross_entropy", what, "ignore_index -100");
    }
    // a good call on the same device still works after the error
    const Tensor ok = zeros(tshape, {DType::i64, kGpu});
    EXPECT_EQ(native::cross_entropy(x, ok, {}).count, numel_of(tshape));
  }
}

TEST(CudaCrossEntropy, ReductionsAreRunToRunIdentical) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = random_tensor({5000, 37}, DType::f32, false, -4.0, 4.0).to(kGpu);
  const Tensor t = random_index({5000}, 37).to(kGpu);
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
    native::CrossEntropyArgs args;
    args.reduction = red;
    const double first = native::cross_entropy(x, t, args).loss.to_vector<double>()[0];
    for (int k = 0; k < 5; ++k) EXPECT_EQ(native::cross_entropy(x, t, args).loss.to_vector<double>()[0], first);
  }
}

// ---- bias + GELU

namespace {

struct GeluCase {
  int64_t rows, cols;
};

std::vector<GeluCase> gelu_cases() {
  std::vector<GeluCase> cases = {{1, 1}, {7, 1}, {1, 33}, {5, 32}, {129, 40}, {300, 3}, {2, 5000}, {1000, 70}};
  for (int k = 0; k < 3; ++k) cases.push_back({uniform_int(1, 400), uniform_int(1, 100)});
  return cases;
}

}  // namespace

TEST(CudaBiasGelu, ForwardMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const GeluCase& k : gelu_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (bool tanh_approx : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(k.rows) + "x" + std::to_string(k.cols) +
                     (tanh_approx ? " tanh" : " erf"));
        const Tensor x = random_tensor({k.rows, k.cols}, dt, false, -4.0, 4.0);
        const Tensor b = random_tensor({k.cols}, compute_dtype(dt));
        const Tensor y = full({k.rows, k.cols}, kNaN, {dt, kGpu});
        native::bias_gelu_stub.call(kGpu, "bias_gelu")(y, x.to(kGpu), b.to(kGpu), tanh_approx);
        const reference::RefTensor want =
            reference::bias_gelu(reference::from_tensor(x), reference::from_tensor(b), tanh_approx);
        const double tol = tolerance(dt);
        EXPECT_TRUE(all_close(y, want, tol, tol));
      }
    }
  }
}

TEST(CudaBiasGelu, BackwardMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const GeluCase& k : gelu_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (bool tanh_approx : {false, true}) {
        for (int want_outputs : {1, 2, 3}) {  // dx only, dbias only, both
          const bool need_dx = want_outputs & 1, need_db = want_outputs & 2;
          SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(k.rows) + "x" + std::to_string(k.cols) +
                       (tanh_approx ? " tanh" : " erf") + (need_dx ? " dx" : "") + (need_db ? " dbias" : ""));
          const DType cd = compute_dtype(dt);
          const Tensor x = random_tensor({k.rows, k.cols}, dt, false, -4.0, 4.0);
          const Tensor g = random_tensor({k.rows, k.cols}, dt);
          const Tensor b = random_tensor({k.cols}, cd);
          const Tensor dx = need_dx ? full({k.rows, k.cols}, kNaN, {dt, kGpu}) : Tensor();
          const Tensor db = need_db ? full({k.cols}, kNaN, {cd, kGpu}) : Tensor();
          native::bias_gelu_backward_stub.call(kGpu, "bias_gelu_backward")(dx, db, g.to(kGpu), x.to(kGpu), b.to(kGpu),
                                                                           tanh_approx);
          const reference::BiasGeluGrads want = reference::bias_gelu_backward(
              reference::from_tensor(g), reference::from_tensor(x), reference::from_tensor(b), tanh_approx);
          const double tol = tolerance(dt);
          if (need_dx) {
            EXPECT_TRUE(all_close(dx, want.dx, tol, tol));
          }
          // dbias sums unrounded products: compute-dtype error per row, growing with the rows
          const double tol_db = tolerance(cd) * (4.0 + double(k.rows) / 8.0);
          if (need_db) {
            EXPECT_TRUE(all_close(db, want.dbias, tolerance(cd), tol_db));
          }
        }
      }
    }
  }
}

TEST(CudaBiasGelu, BiasGradientIsRunToRunIdentical) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = random_tensor({3000, 257}, DType::f32).to(kGpu);
  const Tensor g = random_tensor({3000, 257}, DType::f32).to(kGpu);
  const Tensor b = random_tensor({257}, DType::f32).to(kGpu);
  const native::BiasGeluGrads first = native::bias_gelu_backward(g, x, b, false, false, true);
  const std::vector<double> want = first.dbias.to_vector<double>();
  for (int k = 0; k < 3; ++k) {
    const native::BiasGeluGrads again = native::bias_gelu_backward(g, x, b, false, true, true);
    EXPECT_EQ(again.dbias.to_vector<double>(), want);
  }
}

// The bias gradient's partial sums run over chunks of 128 rows on grid.y, which stops at 65535:
// with more chunks, blocks take several. Rows beyond the first 65535 x 128 must count. The
// gradient is one on the first 128 rows and on the last 300 only, so the bias gradient is 428
// times gelu'(x + b) if every chunk was summed (and 128 times it if the last ones were lost).
TEST(CudaBiasGelu, BiasGradientCountsRowsPastTheGridYCap) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 65535 * 128 + 300, cols = 3, tail = 300;
  const std::vector<float> b = {0.5f, -1.0f, 2.0f};
  const float x0 = 0.25f;
  const Tensor x = full({rows, cols}, x0, {DType::f32, kGpu});
  const Tensor g = zeros({rows, cols}, {DType::f32, kGpu});
  g.narrow(0, 0, 128).fill_(1.0);
  g.narrow(0, rows - tail, tail).fill_(1.0);
  const Tensor bias = from_vector<float>(b).to(kGpu);
  const Tensor dx = full({rows, cols}, kNaN, {DType::f32, kGpu});
  const Tensor db = full({cols}, kNaN, {DType::f32, kGpu});
  native::bias_gelu_backward_stub.call(kGpu, "bias_gelu_backward")(dx, db, g, x, bias, false);
  const std::vector<float> got = db.to_vector<float>();
  for (int64_t j = 0; j < cols; ++j) {
    const double v = double(x0) + double(b[size_t(j)]);
    const double grad =
        0.5 * std::erfc(-v / std::sqrt(2.0)) + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * std::numbers::pi);
    EXPECT_NEAR(got[size_t(j)], (128.0 + double(tail)) * grad, 1e-5 * 428.0) << "column " << j;
    EXPECT_NEAR(dx.select(0, rows - 1).select(0, j).item_double(), grad, 1e-6) << "last row, column " << j;
    EXPECT_EQ(dx.select(0, rows - tail - 1).select(0, j).item_double(), 0.0) << "a row with zero gradient";
  }
  EXPECT_EQ(sum(ne(dx, dx)).item<int64_t>(), 0) << "dx has elements left unwritten (NaN)";
}
