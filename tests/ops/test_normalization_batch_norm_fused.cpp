// batch_norm in training takes one kernel per direction where the CPU has one for the input (the
// plane walk, kernels/cpu/normalization_batch_norm_fused.cpp): its values must be the pieces' bit for
// bit (what a synchronised batch norm computes from the same pieces), on either instruction set
// (the plane loops have an AVX-512 build, kernels/cpu/batch_norm_planes_avx512.cpp).
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/native/normalization.h"
#include "kernels/reference/normalization.h"
#include "normalization_test_util.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::same_bits;
using ember::testing::norm::channel_conditioning;
using ember::testing::norm::grad_tolerance;

namespace {

constexpr double kEps = 1e-5;
constexpr double kMomentum = 0.1;

// Planes of 40 and 37 elements (a partial vector at each plane's end, unaligned plane starts),
// 7x7 and 14x14 feature maps, channel counts that split unevenly between threads and groups.
const Shape kPlaneShapes[] = {{64, 3, 40}, {5, 3, 37}, {3, 4, 7, 7}, {2, 70, 6, 6}, {16, 9, 14, 14}};

struct Results {
  Tensor y, running_mean, running_var, dx, dweight, dbias;
};

struct Inputs {
  Tensor x, g, w, b, running_mean, running_var;
};

Inputs make_inputs(const Shape& shape, DType dt) {
  const Shape c{shape[1]};
  return {random_tensor(shape, dt, false, -3.0, 3.0), random_tensor(shape, dt), random_tensor(c, dt),
          random_tensor(c, dt), random_tensor(c, DType::f32), random_tensor(c, DType::f32, false, 0.5, 2.0)};
}

// batch_norm and its backward through autograd (the fused kernels where they take the input).
Results through_autograd(const Inputs& in) {
  Results r{Tensor(), in.running_mean.clone(), in.running_var.clone(), Tensor(), Tensor(), Tensor()};
  Tensor x = in.x.detach().requires_grad_(), w = in.w.detach().requires_grad_(), b = in.b.detach().requires_grad_();
  r.y = batch_norm(x, r.running_mean, r.running_var, w, b, true, kMomentum, kEps);
  r.y.backward(in.g);
  r.dx = x.grad();
  r.dweight = w.grad();
  r.dbias = b.grad();
  return r;
}

// The same from the pieces, as a synchronised batch norm on one process composes them.
Results through_pieces(const Inputs& in) {
  Results r{Tensor(), in.running_mean.clone(), in.running_var.clone(), Tensor(), Tensor(), Tensor()};
  const native::BatchNormStats sums = native::batch_norm_stats(in.x);
  const native::BatchNormMeanInvstd st =
      native::batch_norm_gather_stats(sums, in.x.dtype(), r.running_mean, r.running_var, kMomentum, kEps);
  r.y = native::batch_norm_elemt(in.x, st.mean, st.invstd, in.w, in.b);
  const native::BatchNormReduced red =
      native::batch_norm_backward_reduce(in.g, in.x, st.mean, st.invstd, in.w, in.b, true, true);
  r.dx = native::batch_norm_backward_elemt(in.g, in.x, st.mean, st.invstd, in.w, red.sum_dy, red.sum_dy_xmu,
                                           sums.count);
  r.dweight = red.dweight;
  r.dbias = red.dbias;
  return r;
}

void expect_same_bits(const Results& a, const Results& b) {
  EXPECT_TRUE(same_bits(a.y, b.y)) << "y";
  EXPECT_TRUE(same_bits(a.running_mean, b.running_mean)) << "running_mean";
  EXPECT_TRUE(same_bits(a.running_var, b.running_var)) << "running_var";
  EXPECT_TRUE(same_bits(a.dx, b.dx)) << "dx";
  EXPECT_TRUE(same_bits(a.dweight, b.dweight)) << "dweight";
  EXPECT_TRUE(same_bits(a.dbias, b.dbias)) << "dbias";
}

// Every instruction set this CPU offers (AVX2 always; AVX-512 where it has it).
std::vector<CpuCapability> capabilities() {
  std::vector<CpuCapability> caps{CpuCapability::Avx2};
  const CpuCapability saved = cpu_capability();
  set_cpu_capability(CpuCapability::Avx512);  // capped at what the CPU has
  if (cpu_capability() == CpuCapability::Avx512) caps.push_back(CpuCapability::Avx512);
  set_cpu_capability(saved);
  return caps;
}

}  // namespace

TEST(BatchNormFused, TakesThePlaneWalk) {
  // what the comparisons below rely on: the fused kernels do run for these inputs
  const Inputs in = make_inputs(kPlaneShapes[0], DType::f32);
  EXPECT_TRUE(native::batch_norm_fused_forward(in.x, in.w, in.b, Tensor(), Tensor(), kMomentum, kEps).done);
  const native::BatchNormMeanInvstd st = native::batch_norm_gather_stats(native::batch_norm_stats(in.x), DType::f32,
                                                                         Tensor(), Tensor(), kMomentum, kEps);
  EXPECT_TRUE(native::batch_norm_fused_backward(in.g, in.x, st.mean, st.invstd, in.w, in.b, true, true).done);
  // planes under 32 elements go row by row, through the pieces
  const Inputs rows = make_inputs({50, 7}, DType::f32);
  EXPECT_FALSE(native::batch_norm_fused_forward(rows.x, rows.w, rows.b, Tensor(), Tensor(), kMomentum, kEps).done);
}

TEST(BatchNormFused, MatchesThePiecesBitForBitOnEveryInstructionSet) {
  const CpuCapability saved = cpu_capability();
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (const Shape& shape : kPlaneShapes) {
      const Inputs in = make_inputs(shape, dt);
      std::vector<Results> fused;
      for (CpuCapability cap : capabilities()) {
        set_cpu_capability(cap);
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape) + " " + cpu_capability_name(cap));
        fused.push_back(through_autograd(in));
        expect_same_bits(fused.back(), through_pieces(in));
        if (fused.size() > 1) expect_same_bits(fused.back(), fused.front());
      }
      set_cpu_capability(saved);
    }
  }
}

TEST(BatchNormFused, SumsAreTheSameBitsOnEveryInstructionSet) {
  // The f64 sums themselves, which the f32 results round away most differences of: those of the
  // pieces on each instruction set, and the fused backward's against the reduce piece's.
  const CpuCapability saved = cpu_capability();
  for (const Shape& shape : kPlaneShapes) {
    const Inputs in = make_inputs(shape, DType::f32);
    std::vector<Tensor> sums;
    for (CpuCapability cap : capabilities()) {
      set_cpu_capability(cap);
      SCOPED_TRACE(shape_str(shape) + " " + cpu_capability_name(cap));
      const native::BatchNormStats st = native::batch_norm_stats(in.x);
      const native::BatchNormMeanInvstd mi =
          native::batch_norm_gather_stats(st, DType::f32, Tensor(), Tensor(), kMomentum, kEps);
      const native::BatchNormReduced red =
          native::batch_norm_backward_reduce(in.g, in.x, mi.mean, mi.invstd, in.w, in.b, false, false);
      const native::BatchNormFusedGrads fused =
          native::batch_norm_fused_backward(in.g, in.x, mi.mean, mi.invstd, in.w, in.b, false, false);
      ASSERT_TRUE(fused.done);
      EXPECT_TRUE(same_bits(fused.reduced.sum_dy, red.sum_dy)) << "sum_dy";
      EXPECT_TRUE(same_bits(fused.reduced.sum_dy_xmu, red.sum_dy_xmu)) << "sum_dy_xmu";
      sums.push_back(cat({st.sum, st.sumsq, red.sum_dy, red.sum_dy_xmu}, 0));
      if (sums.size() > 1) EXPECT_TRUE(same_bits(sums.back(), sums.front())) << "sums";
    }
    set_cpu_capability(saved);
  }
}

TEST(BatchNormFused, MatchesTheReferenceOnEveryInstructionSet) {
  const CpuCapability saved = cpu_capability();
  for (const Shape& shape : kPlaneShapes) {
    const Inputs in = make_inputs(shape, DType::f32);
    const auto rx = reference::from_tensor(in.x), rw = reference::from_tensor(in.w), rb = reference::from_tensor(in.b);
    const auto rrm = reference::from_tensor(in.running_mean), rrv = reference::from_tensor(in.running_var);
    const auto ref = reference::batch_norm(rx, &rrm, &rrv, &rw, &rb, true, kMomentum, kEps);
    const auto rgrad = reference::batch_norm_backward(reference::from_tensor(in.g), rx, nullptr, nullptr, &rw, true, kEps);
    const double tol = 4e-5 * std::max(1.0, channel_conditioning(rx, kEps, 2) / 100);
    const double gtol = grad_tolerance(DType::f32) * std::max(1.0, channel_conditioning(rx, kEps, 2) / 10);
    const double ptol = gtol * double(numel_of(shape) / shape[1]);
    for (CpuCapability cap : capabilities()) {
      set_cpu_capability(cap);
      SCOPED_TRACE(shape_str(shape) + " " + cpu_capability_name(cap));
      const Results r = through_autograd(in);
      EXPECT_TRUE(all_close(r.y, ref.y, tol, tol)) << "y";
      EXPECT_TRUE(all_close(r.running_mean, ref.running_mean, 1e-6, 1e-6)) << "running_mean";
      EXPECT_TRUE(all_close(r.running_var, ref.running_var, 1e-6, 1e-6)) << "running_var";
      EXPECT_TRUE(all_close(r.dx, rgrad.dx, gtol, gtol)) << "dx";
      EXPECT_TRUE(all_close(r.dweight, rgrad.dweight, gtol, ptol)) << "dweight";
      EXPECT_TRUE(all_close(r.dbias, rgrad.dbias, gtol, ptol)) << "dbias";
    }
    set_cpu_capability(saved);
  }
}
