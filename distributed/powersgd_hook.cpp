#include "distributed/powersgd_hook.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace ember::distributed {

namespace {

// One compressed matrix of a bucket: where it sits, its shape as n x m, its rank, its Q.
struct Factor {
  int64_t offset = 0, n = 0, m = 0, r = 0;
  size_t param = 0;  // index within the bucket
  Tensor q;          // m x r, kept across passes with warm_start
};

// What a bucket keeps between passes.
struct BucketState {
  std::vector<std::string> names;  // the layout it was made for
  Tensor error;                    // the bucket's size: what the last approximation left out
  std::vector<Factor> factors;
  std::vector<std::pair<int64_t, int64_t>> plain;  // (offset, numel) reduced as they are
};

struct HookState {
  PowerSGDOptions options;
  int64_t passes = 0;  // synchronised passes seen (counted at each pass's last bucket)
  std::map<size_t, BucketState> buckets;
  std::mutex mu;
};

Tensor draw_q(uint64_t seed, size_t bucket, size_t param, int64_t pass, int64_t m, int64_t r) {
  std::seed_seq seq{seed, uint64_t(bucket), uint64_t(param), uint64_t(pass)};
  std::mt19937_64 gen(seq);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(size_t(m * r));
  for (float& x : v) x = normal(gen);
  return from_vector<float>(v, {m, r});
}

// Gram-Schmidt on the columns of a contiguous n x r f32 matrix, in place, projecting twice
// (once is not enough in f32). A column that is (nearly) a combination of the ones before it,
// as when M's rank is below r, is set to zero: normalising its rounding noise would add a
// direction that is not M's.
void orthogonalise(Tensor p) {
  EMBER_CHECK(p.is_contiguous(), "powersgd_hook: P must be contiguous");
  const int64_t n = p.size(0), r = p.size(1);
  float* a = p.data_ptr<float>();
  p.bump_version();
  auto column_norm = [&](int64_t j) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(a[i * r + j]) * double(a[i * r + j]);
    return std::sqrt(s);
  };
  for (int64_t j = 0; j < r; ++j) {
    const double before = column_norm(j);
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += double(a[i * r + j]) * double(a[i * r + k]);
        for (int64_t i = 0; i < n; ++i) a[i * r + j] -= float(dot) * a[i * r + k];
      }
    const double after = column_norm(j);
    const float scale = after > 1e-4 * before && after > 0 ? float(1.0 / after) : 0.0f;
    for (int64_t i = 0; i < n; ++i) a[i * r + j] *= scale;
  }
}

BucketState plan_bucket(const GradBucket& b, const PowerSGDOptions& o) {
  BucketState s;
  s.names = b.parameter_names;
  int64_t offset = 0;
  for (size_t i = 0; i < b.parameter_shapes.size(); ++i) {
    const Shape& shape = b.parameter_shapes[i];
    const int64_t numel = numel_of(shape);
    bool compressed = false;
    if (shape.size() >= 2 && numel > 0) {
      const int64_t n = shape[0], m = numel / n;
      const int64_t r = std::min<int64_t>({o.matrix_approximation_rank, n, m});
      if (o.min_compression_rate <= 0 || double(n * m) >= o.min_compression_rate * double((n + m) * r)) {
        s.factors.push_back(Factor{offset, n, m, r, i, Tensor()});
        compressed = true;
      }
    }
    if (!compressed && numel > 0) s.plain.emplace_back(offset, numel);
    offset += numel;
  }
  EMBER_CHECK(offset == b.buffer.numel(), "powersgd_hook: bucket ", b.index, " holds ", b.buffer.numel(),
              " elements but its parameters ", offset);
  return s;
}

// Runs the rest of the bucket's reduction the first time it is waited on: the P all-reduce,
// then Q's, then the approximation written into the bucket.
class PowerSGDWork : public Work {
 public:
  std::function<void()> finish;
  void wait() override {
    std::call_once(done_, [this] { finish(); });  // a throw leaves it to be retried, rethrowing
    completed_ = true;
  }
  bool is_completed() override { return completed_; }

 private:
  std::once_flag done_;
  bool completed_ = false;
};

std::shared_ptr<Work> compress(GradBucket& b, HookState& st) {
  ProcessGroup& pg = *b.process_group;
  EMBER_CHECK(b.buffer.device().is_cpu() && b.buffer.dtype() == DType::f32, "powersgd_hook: bucket ", b.index,
              " is ", dtype_name(b.buffer.dtype()), " on ", b.buffer.device().str(),
              "; PowerSGD compresses f32 CPU gradients (use the bf16 or fp16 hook elsewhere)");
  EMBER_CHECK(b.parameter_shapes.size() == b.parameter_names.size(), "powersgd_hook: bucket ", b.index,
              " comes without its parameter shapes");
  NoGradGuard no_grad;
  const PowerSGDOptions& o = st.options;
  BucketState* state;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.buckets.find(b.index);
    if (it == st.buckets.end() || it->second.names != b.parameter_names)  // new, or a rebuilt layout
      it = st.buckets.insert_or_assign(b.index, plan_bucket(b, o)).first;
    state = &it->second;
  }
  Tensor buffer = b.buffer;
  const double inv_world = 1.0 / double(pg.size());
  // The error stays in this rank's units (its gradient minus the shared approximation of the
  // mean): over the ranks the errors sum to the world size times the mean's compression error.
  if (o.use_error_feedback && state->error.defined()) buffer.add_(state->error);
  Tensor input = o.use_error_feedback ? buffer.clone() : Tensor();

  int64_t plain_numel = 0, p_numel = 0, q_numel = 0;
  for (const auto& [off, numel] : state->plain) plain_numel += numel;
  for (Factor& f : state->factors) {
    p_numel += f.n * f.r;
    q_numel += f.m * f.r;
    if (!f.q.defined() || !o.warm_start) f.q = draw_q(o.seed, b.index, f.param, o.warm_start ? 0 : st.passes, f.m, f.r);
  }
  Tensor plain = zeros({plain_numel}), ps = zeros({p_numel}), qs = zeros({q_numel});
  int64_t at = 0;
  for (const auto& [off, numel] : state->plain) {
    plain.narrow(0, at, numel).copy_(buffer.narrow(0, off, numel));
    at += numel;
  }
  at = 0;
  for (const Factor& f : state->factors) {
    Tensor mat = buffer.narrow(0, f.offset, f.n * f.m).view({f.n, f.m});
    ps.narrow(0, at, f.n * f.r).view({f.n, f.r}).copy_(matmul(mat, f.q));
    at += f.n * f.r;
  }
  b.wire_bytes = (plain_numel + p_numel + q_numel) * int64_t(sizeof(float));
  std::shared_ptr<Work> plain_work = plain_numel > 0 ? pg.allreduce(plain, ReduceOp::Sum) : nullptr;
  std::shared_ptr<Work> p_work = p_numel > 0 ? pg.allreduce(ps, ReduceOp::Sum) : nullptr;

  auto work = std::make_shared<PowerSGDWork>();
  ProcessGroup* group = &pg;
  work->finish = [=, &pg = *group]() mutable {  // P's sum needs no division: P is orthogonalised
    NoGradGuard inner_no_grad;
    if (plain_work) plain_work->wait();
    int64_t k = 0;
    for (const auto& [off, numel] : state->plain) {
      buffer.narrow(0, off, numel).copy_(plain.narrow(0, k, numel)).mul_(inv_world);
      k += numel;
    }
    if (!p_work) return;
    p_work->wait();
    int64_t pa = 0, qa = 0;
    for (const Factor& f : state->factors) {
      Tensor p = ps.narrow(0, pa, f.n * f.r).view({f.n, f.r});
      orthogonalise(p);
      Tensor mat = buffer.narrow(0, f.offset, f.n * f.m).view({f.n, f.m});
      qs.narrow(0, qa, f.m * f.r).view({f.m, f.r}).copy_(matmul(mat.t(), p));
      pa += f.n * f.r;
      qa += f.m * f.r;
    }
    pg.allreduce(qs, ReduceOp::Sum)->wait();  // the sum's Q: (sum of M)^T P
    qs.mul_(inv_world);
    pa = qa = 0;
    for (Factor& f : state->factors) {
      Tensor p = ps.narrow(0, pa, f.n * f.r).view({f.n, f.r});
      Tensor q = qs.narrow(0, qa, f.m * f.r).view({f.m, f.r});
      buffer.narrow(0, f.offset, f.n * f.m).view({f.n, f.m}).copy_(matmul(p, q.t()));
      f.q = q.clone();
      pa += f.n * f.r;
      qa += f.m * f.r;
    }
    if (input.defined()) {
      // What this rank's input had that the shared approximation lacks; plain tensors lose nothing.
      Tensor error = sub(input, buffer);
      for (const auto& [off, numel] : state->plain) error.narrow(0, off, numel).zero_();
      state->error = error;
    }
  };
  return work;
}

}  // namespace

CommHook powersgd_hook(PowerSGDOptions options) {
  EMBER_CHECK(options.matrix_approximation_rank >= 1, "powersgd_hook: matrix_approximation_rank must be at least 1, got ",
              options.matrix_approximation_rank);
  EMBER_CHECK(options.start_iter >= 0, "powersgd_hook: start_iter must be >= 0, got ", options.start_iter);
  auto state = std::make_shared<HookState>();
  state->options = options;
  return [state](GradBucket& b) -> std::shared_ptr<Work> {
    EMBER_CHECK(b.process_group != nullptr, "powersgd_hook: the bucket has no process group");
    const bool warming_up = state->passes < state->options.start_iter;
    if (b.is_last) state->passes++;
    return warming_up ? allreduce_hook(b) : compress(b, *state);
  };
}

}  // namespace ember::distributed
