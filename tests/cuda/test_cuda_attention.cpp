// CUDA packed self-attention (native::attention_stub and its backward, through
// native::packed_self_attention) against the
// double reference: head dims with exact tiles (32, 64, 128), below and between them (16, 72)
// and up to the 256 limit, lengths of one, inside one tile, exactly one or two tiles and just
// past them, no mask, a padding mask [B, 1, 1, L] with -inf keys and a full [B, heads, L, L]
// mask, with and without dropout, in f32, bf16 and f64. The keep mask must equal the CPU's bit
// for bit; stats are compared with the CPU kernel's. Every test skips without a CUDA device.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/fused.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/reference/fused.h"
#include "kernels/reference/nn_functional.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using reference::RefTensor;

namespace {

// These suites test Ember's own attention kernels (their stats layout included): the cuDNN path,
// tested in test_cuda_attention_cudnn.cpp, stays off in this binary.
class EmberAttentionKernelsOnly : public ::testing::Environment {
 public:
  void SetUp() override { ember::cuda::set_cudnn_attention(false); }
};
[[maybe_unused]] ::testing::Environment* const kEmberKernelsOnly =
    ::testing::AddGlobalTestEnvironment(new EmberAttentionKernelsOnly);

const Device kGpu = Device::cuda(0);
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

enum class MaskKind { None, Padding, Full };

const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::None: return "no mask";
    case MaskKind::Padding: return "padding mask";
    default: return "full mask";
  }
}

// Padding: [B, 1, 1, L] with the last keys of each sequence at -inf (key 0 always kept), in the
// data's dtype. Full: [B, heads, L, L] random in [-3, 1), f32.
Tensor make_mask(MaskKind kind, int64_t b, int64_t heads, int64_t len, DType dt) {
  if (kind == MaskKind::None) return Tensor();
  if (kind == MaskKind::Full) return random_tensor({b, heads, len, len}, DType::f32, false, -3.0, 1.0);
  std::vector<double> m(static_cast<size_t>(b * len), 0.0);
  for (int64_t n = 0; n < b; ++n) {
    const int64_t pad = std::min(len - 1, uniform_int(0, len / 2 + 1));
    for (int64_t j = len - pad; j < len; ++j) m[size_t(n * len + j)] = -kInf;
  }
  return from_vector(m, {b, 1, 1, len}).to(dt);
}

using GpuForward = native::PackedAttentionResult;

// The CUDA forward, drawing the dropout from generator state `st`; qkv and mask on the host.
GpuForward gpu_forward(const Tensor& qkv, int64_t heads, const Tensor& mask, double scale, double p,
                       const GeneratorState& st) {
  Generator gen(0);
  gen.set_state(st);
  return native::packed_self_attention(qkv.to(kGpu), heads, mask.defined() ? mask.to(kGpu) : Tensor(), scale, p, gen);
}

// The CUDA backward.
Tensor gpu_backward(const Tensor& grad, const GpuForward& fw, double p) {
  return native::packed_self_attention_backward(grad.to(kGpu), fw.saved, p > 0 ? 1.0 / (1.0 - p) : 1.0);
}

double max_abs(const RefTensor& t) {
  double m = 0;
  for (double v : t.data)
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  return m;
}

struct Case {
  int64_t d, len;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t d : {16, 32, 64, 128, 72})
    for (int64_t len : {1, 7, 64, 130}) out.push_back({d, len});
  out.push_back({64, 128});
  out.push_back({32, 129});
  out.push_back({200, 33});  // the widest tiles: 32 rows, 256 columns
  out.push_back({256, 70});
  out.push_back({uniform_int(1, 256), uniform_int(1, 150)});
  return out;
}

std::string label(DType dt, const Case& k, int64_t b, int64_t heads, MaskKind mk, double p) {
  return std::string(dtype_name(dt)) + " d " + std::to_string(k.d) + " len " + std::to_string(k.len) + " batch " +
         std::to_string(b) + " heads " + std::to_string(heads) + " " + mask_name(mk) + " p " + std::to_string(p);
}

}  // namespace

TEST(CudaPackedAttention, ForwardAndBackwardMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const std::vector<Case> all = cases();
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f64};
  const MaskKind masks[] = {MaskKind::None, MaskKind::Padding, MaskKind::Full};
  for (size_t ci = 0; ci < all.size(); ++ci) {
    const Case& k = all[ci];
    for (int di = 0; di < 3; ++di) {
      const DType dt = dtypes[di];
      for (int mi = 0; mi < 3; ++mi) {
        const MaskKind mk = masks[mi];
        {
          // dropout on for every other combination: each case sees both for every mask
          const double p = (ci + size_t(di) + size_t(mi)) % 2 ? 0.2 : 0.0;
          const int64_t b = uniform_int(1, 2), heads = uniform_int(1, 3), e = heads * k.d;
          SCOPED_TRACE(label(dt, k, b, heads, mk, p));
          const double scale = 1.0 / std::sqrt(double(k.d));
          const Tensor qkv = random_tensor({b, k.len, 3 * e}, dt, false, -1.5, 1.5);
          const Tensor mask = make_mask(mk, b, heads, k.len, dt);
          const GeneratorState st{uint64_t(uniform_int(0, 1 << 30)), uint64_t(uniform_int(0, 1000))};
          const GpuForward fw = gpu_forward(qkv, heads, mask, scale, p, st);

          const RefTensor rqkv = reference::from_tensor(qkv);
          const RefTensor rmask = mask.defined() ? reference::from_tensor(mask) : RefTensor();
          const RefTensor* pm = mask.defined() ? &rmask : nullptr;
          const RefTensor keep = reference::dropout_mask({b, heads, k.len, k.len}, p, st);
          const RefTensor* kp = p > 0 ? &keep : nullptr;
          if (p > 0) {
            EXPECT_TRUE(all_close(fw.saved.keep.to(Device::cpu()).to(DType::f64), keep, 0.0, 0.0)) << "keep mask";
          }

          const bool narrow = dt == DType::bf16;
          const double tol = narrow ? 3 * tolerance(dt) : 20 * tolerance(dt);
          const RefTensor want = reference::packed_self_attention(rqkv, heads, pm, kp, p);
          EXPECT_TRUE(all_close(fw.ctx, want, tol, tol * std::max(1.0, max_abs(want)))) << "ctx";

          // stats against the CPU kernel on the same data
          Generator gen(0);
          gen.set_state(st);
          const native::PackedAttentionResult cpu =
              native::packed_self_attention(qkv, heads, mask, scale, p, gen);
          const double stol = dt == DType::f64 ? 1e-9 : 1e-4;
          EXPECT_TRUE(all_close(fw.saved.stats, cpu.saved.stats, stol, stol)) << "stats";

          const Tensor g = random_tensor({b, k.len, e}, dt);
          const Tensor dqkv = gpu_backward(g, fw, p);
          const RefTensor gwant =
              reference::packed_self_attention_backward(reference::from_tensor(g), rqkv, heads, pm, kp, p);
          const double gtol = narrow ? 6 * tolerance(dt) : 50 * tolerance(dt);
          EXPECT_TRUE(all_close(dqkv, gwant, gtol, gtol * std::max(1.0, max_abs(gwant)))) << "dqkv";
        }
      }
    }
  }
}

// Rows the CPU treats specially: a query row with every key at -inf gets stats (-inf, NaN) and a
// NaN ctx row; a row whose first key tiles are all -inf but later keys finite is an ordinary
// row (the online softmax must not turn the masked tiles into NaN); a NaN in the mask makes its
// row NaN.
TEST(CudaPackedAttention, MaskedAndNaNRowsMatchTheCpuKernel) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    for (int64_t d : {32, 40}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " d " + std::to_string(d));
      const int64_t b = 2, heads = 2, len = 150, e = heads * d;
      const double scale = 1.0 / std::sqrt(double(d));
      const Tensor qkv = random_tensor({b, len, 3 * e}, dt, false, -1.5, 1.5);
      std::vector<double> m(static_cast<size_t>(b * heads * len * len), 0.0);
      auto at = [&](int64_t n, int64_t h, int64_t i, int64_t j) -> double& {
        return m[size_t(((n * heads + h) * len + i) * len + j)];
      };
      for (int64_t j = 0; j < len; ++j) at(0, 1, 3, j) = -kInf;       // fully masked row
      for (int64_t j = 0; j < 140; ++j) at(1, 0, 70, j) = -kInf;      // finite only past two key tiles
      at(1, 1, 100, 5) = kNaN;                                         // NaN row
      const Tensor mask = from_vector(m, {b, heads, len, len}).to(DType::f32);
      const GeneratorState st{7, 0};
      const GpuForward fw = gpu_forward(qkv, heads, mask, scale, 0.0, st);
      Generator gen(0);
      const native::PackedAttentionResult cpu = native::packed_self_attention(qkv, heads, mask, scale, 0.0, gen);
      const double tol = dt == DType::bf16 ? 3 * tolerance(dt) : 20 * tolerance(dt);
      EXPECT_TRUE(all_close(fw.ctx, cpu.ctx, tol, tol)) << "ctx";
      EXPECT_TRUE(all_close(fw.saved.stats, cpu.saved.stats, 1e-4, 1e-4)) << "stats";
      const double max_of_masked = fw.saved.stats.to(Device::cpu()).to(DType::f64).to_vector<double>()[size_t(2 * (1 * len + 3))];
      EXPECT_EQ(max_of_masked, -kInf);

      const Tensor g = random_tensor({b, len, e}, dt);
      const Tensor dqkv = gpu_backward(g, fw, 0.0);
      const Tensor want = native::packed_self_attention_backward(g, cpu.saved, 1.0);
      const double gtol = dt == DType::bf16 ? 6 * tolerance(dt) : 50 * tolerance(dt);
      EXPECT_TRUE(all_close(dqkv, want, gtol, gtol)) << "dqkv";
    }
  }
}

// The backward owns every output element in one thread (no atomics): repeated runs agree bit
// for bit.
TEST(CudaPackedAttention, BackwardIsDeterministic) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const int64_t b = 2, heads = 4, len = 200, d = 64, e = heads * d;
  const double scale = 1.0 / std::sqrt(double(d));
  const Tensor qkv = random_tensor({b, len, 3 * e});
  const Tensor mask = make_mask(MaskKind::Padding, b, heads, len, DType::f32);
  const Tensor g = random_tensor({b, len, e});
  const GeneratorState st{11, 4};
  const GpuForward fw = gpu_forward(qkv, heads, mask, scale, 0.1, st);
  const Tensor first = gpu_backward(g, fw, 0.1).to(Device::cpu());
  for (int run = 0; run < 3; ++run) {
    const Tensor again = gpu_backward(g, fw, 0.1).to(Device::cpu());
    EXPECT_EQ(again.to_vector<float>(), first.to_vector<float>());
  }
  const GpuForward fw2 = gpu_forward(qkv, heads, mask, scale, 0.1, st);
  EXPECT_EQ(fw2.ctx.to(Device::cpu()).to_vector<float>(), fw.ctx.to(Device::cpu()).to_vector<float>());
}

TEST(CudaPackedAttention, HeadDimAbove256IsRejected) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor qkv = zeros({1, 3, 3 * 300}, {DType::f32, kGpu});
  EXPECT_EMBER_ERROR(native::packed_self_attention(qkv, 1, Tensor(), 0.1, 0.0), "attention", "head dims up to 256",
                     "300");
}
