// native::adam_multi_step on the CPU: parameters of different sizes and shapes updated by one
// call over several steps equal adam_step on each, bit for bit, for every pairing of param and
// grad dtype, with and without weight decay and gradient scaling. Empty entries are skipped,
// adjacent slices of one buffer are separate parameters, and bad lists raise errors naming the
// entry before anything is updated.
#include <cmath>
#include <string>
#include <vector>

#include "core/native/fused_optim.h"
#include "adam_args.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::same_bytes;
using ember::testing::random_tensor;
using ember::testing::uniform_int;
using native::AdamTensors;

namespace {

native::AdamStepArgs make_args(bool decoupled, double weight_decay, double grad_scale, int step) {
  return ember::testing::adam_test_args(decoupled, weight_decay, grad_scale, step);
}

struct State {
  Tensor p, m, v;
};

State random_state(const Shape& shape, DType dt) {
  return {random_tensor(shape, dt), random_tensor(shape, dt, false, -0.5, 0.5), random_tensor(shape, dt, false, 0.0, 0.5)};
}

State clone(const State& s) { return {s.p.clone(), s.m.clone(), s.v.clone()}; }

// Shapes of the parameters of one list: tiny, odd, empty, multi-dimensional, one spanning several
// parallel_for chunks of the CPU kernel, and a few random ones.
std::vector<Shape> list_shapes() {
  std::vector<Shape> shapes = {{1}, {7}, {8}, {0}, {3, 5}, {2, 3, 4}, {16384 + 3}, {40000}};
  for (int k = 0; k < 3; ++k) shapes.push_back({uniform_int(1, 5000)});
  return shapes;
}

void expect_same_bytes(const std::vector<State>& got, const std::vector<State>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("entry " + std::to_string(i) + ", shape " + shape_str(got[i].p.shape()));
    EXPECT_TRUE(same_bytes(got[i].p, want[i].p)) << "param";
    EXPECT_TRUE(same_bytes(got[i].m, want[i].m)) << "exp_avg";
    EXPECT_TRUE(same_bytes(got[i].v, want[i].v)) << "exp_avg_sq";
  }
}

std::vector<AdamTensors> entries(const std::vector<State>& s, const std::vector<Tensor>& grads) {
  std::vector<AdamTensors> out;
  for (size_t i = 0; i < s.size(); ++i) out.push_back({s[i].p, grads[i], s[i].m, s[i].v});
  return out;
}

}  // namespace

TEST(AdamMultiTensor, MatchesPerTensorStepsBitForBit) {
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const std::vector<Shape> shapes = list_shapes();
  for (DType param_dt : {DType::f32, DType::f64}) {
    for (DType grad_dt : ember::testing::kFloatTypes) {
      for (bool decoupled : {true, false}) {
        for (double wd : {0.0, 0.05}) {
          for (double grad_scale : {1.0, 0.25}) {
            SCOPED_TRACE(std::string(dtype_name(param_dt)) + " params, " + dtype_name(grad_dt) + " grads, " +
                         (decoupled ? "AdamW" : "Adam") + ", weight_decay " + std::to_string(wd) +
                         ", grad_scale " + std::to_string(grad_scale));
            std::vector<State> single, multi, initial;
            for (const Shape& s : shapes) {
              initial.push_back(random_state(s, param_dt));
              single.push_back(clone(initial.back()));
              multi.push_back(clone(initial.back()));
            }
            for (int step = 1; step <= 3; ++step) {
              std::vector<Tensor> grads;
              for (const Shape& s : shapes) grads.push_back(random_tensor(s, grad_dt, false, -1.0, 1.0));
              const native::AdamStepArgs args = make_args(decoupled, wd, grad_scale, step);
              for (size_t i = 0; i < shapes.size(); ++i)
                native::adam_step(single[i].p, grads[i], single[i].m, single[i].v, args);
              native::adam_multi_step(entries(multi, grads), args);
            }
            expect_same_bytes(multi, single);
            // the steps moved every non-empty parameter
            for (size_t i = 0; i < shapes.size(); ++i) {
              if (initial[i].p.numel() > 0) {
                EXPECT_FALSE(same_bytes(multi[i].p, initial[i].p)) << "entry " << i;
              }
            }
          }
        }
      }
    }
  }
}

TEST(AdamMultiTensor, AdjacentSlicesOfOneBufferAreSeparateParameters) {
  const Tensor buf = random_tensor({10}), mbuf = zeros({10}), vbuf = zeros({10});
  const Tensor grad = random_tensor({10});
  State a{buf.slice(0, 0, 4), mbuf.slice(0, 0, 4), vbuf.slice(0, 0, 4)};
  State b{buf.slice(0, 4, 10), mbuf.slice(0, 4, 10), vbuf.slice(0, 4, 10)};
  const std::vector<State> want = {clone(a), clone(b)};
  const native::AdamStepArgs args = make_args(true, 0.05, 1.0, 1);
  native::adam_step(want[0].p, grad.slice(0, 0, 4), want[0].m, want[0].v, args);
  native::adam_step(want[1].p, grad.slice(0, 4, 10), want[1].m, want[1].v, args);
  native::adam_multi_step({{a.p, grad.slice(0, 0, 4), a.m, a.v}, {b.p, grad.slice(0, 4, 10), b.m, b.v}}, args);
  expect_same_bytes({a, b}, want);
}

TEST(AdamMultiTensor, EmptyListAndEmptyEntriesAreNoOps) {
  const native::AdamStepArgs args = make_args(true, 0.05, 1.0, 1);
  EXPECT_NO_THROW(native::adam_multi_step({}, args));
  const State empty = random_state({0, 3}, DType::f32);
  EXPECT_NO_THROW(native::adam_multi_step({{empty.p, zeros({0, 3}), empty.m, empty.v}}, args));
  // an empty entry between two others leaves them updated as adam_step would
  const State a = random_state({5}, DType::f32), b = random_state({6}, DType::f32);
  const Tensor ga = random_tensor({5}), gb = random_tensor({6});
  const std::vector<State> want = {clone(a), clone(b)};
  native::adam_step(want[0].p, ga, want[0].m, want[0].v, args);
  native::adam_step(want[1].p, gb, want[1].m, want[1].v, args);
  native::adam_multi_step({{a.p, ga, a.m, a.v}, {empty.p, zeros({0, 3}), empty.m, empty.v}, {b.p, gb, b.m, b.v}},
                          args);
  expect_same_bytes({a, b}, want);
}

TEST(AdamMultiTensor, BadListsRaiseErrorsNamingTheEntryAndUpdateNothing) {
  const native::AdamStepArgs args = make_args(true, 0.05, 1.0, 1);
  const State a = random_state({5}, DType::f32), b = random_state({5}, DType::f32);
  const State a0 = clone(a);
  const Tensor g = random_tensor({5});
  const auto with_b = [&](Tensor p, Tensor grad, Tensor m, Tensor v) {
    native::adam_multi_step({{a.p, g, a.m, a.v}, {std::move(p), std::move(grad), std::move(m), std::move(v)}}, args);
  };
  EXPECT_EMBER_ERROR(with_b(b.p, Tensor(), b.m, b.v), "adam_multi_step", "grad of entry 1 is undefined");
  EXPECT_EMBER_ERROR(with_b(b.p, g, Tensor(), b.v), "adam_multi_step", "exp_avg of entry 1 is undefined");
  EXPECT_EMBER_ERROR(with_b(b.p, g, b.m, zeros({4})), "adam_multi_step", "exp_avg_sq of entry 1 has shape [4]",
                     "its param has [5]");
  EXPECT_EMBER_ERROR(with_b(b.p, zeros({5, 1}), b.m, b.v), "adam_multi_step", "grad of entry 1 has shape [5, 1]");
  EXPECT_EMBER_ERROR(with_b(b.p, g.to(DType::f16), b.m, b.v), "adam_multi_step", "grad of entry 1",
                     "dtype float16", "expected float32");
  EXPECT_EMBER_ERROR(with_b(b.p.to(DType::f64), g, b.m.to(DType::f64), b.v.to(DType::f64)), "adam_multi_step",
                     "param of entry 1", "dtype float64", "expected float32");
  EXPECT_EMBER_ERROR(with_b(b.p, g, b.m, b.v.to(DType::f64)), "adam_multi_step", "exp_avg_sq of entry 1",
                     "dtype float64");
  const Tensor strided = random_tensor({5}, DType::f32, true);
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_EMBER_ERROR(with_b(b.p, g, strided, b.v), "adam_multi_step", "exp_avg of entry 1 must be contiguous");
  // the same parameter twice, or overlapping slices of one buffer: updated concurrently on CUDA
  EXPECT_EMBER_ERROR(with_b(a.p, g, b.m, b.v), "adam_multi_step", "entries 0 and 1 share memory");
  EXPECT_EMBER_ERROR(with_b(b.p, g, a.m, b.v), "adam_multi_step", "share memory");
  const Tensor buf = random_tensor({8});
  EXPECT_EMBER_ERROR(native::adam_multi_step({{buf.slice(0, 0, 5), g, zeros({5}), zeros({5})},
                                              {buf.slice(0, 3, 8), g, zeros({5}), zeros({5})}},
                                             args),
                     "adam_multi_step", "share memory");
  EXPECT_EMBER_ERROR(native::adam_multi_step({{zeros({3}, {DType::i64}), zeros({3}, {DType::i64}),
                                               zeros({3}, {DType::i64}), zeros({3}, {DType::i64})}},
                                             args),
                     "adam_multi_step", "floating-point", "int64");
  // no error left entry 0 half-updated
  EXPECT_TRUE(same_bytes(a.p, a0.p));
  EXPECT_TRUE(same_bytes(a.m, a0.m));
  EXPECT_TRUE(same_bytes(a.v, a0.v));
}
