// Memory-bound CUDA kernels of Ember against the device's own copy bandwidth.
//
// The reference is cudaMemcpyAsync device-to-device of a 1 GiB buffer, counted as bytes read
// plus bytes written per second. Every other row runs an Ember op on CUDA tensors through the
// public native:: functions (the same entry points autograd calls) and divides the bytes that
// op must move at minimum by its time: each input read once, each output written once,
// nothing for intermediates a fused kernel could keep on chip. The last column is that rate as
// a percentage of the measured copy rate, so a kernel that streams its data at full speed
// reads close to 100 %.
//
// Timing: CUDA events on cuda::current_stream(), 3 untimed warm-up runs, then the median of 20
// timed runs (5 with --quick). Before each timed run a memset of a buffer at least twice the
// L2 size evicts the previous run's data, so every run reads from DRAM; it is queued before
// the start event and not timed. An op's time includes what any caller pays: allocating its
// outputs from the caching allocator and its host-side checks (the memset ahead of it usually
// hides those), and a host synchronisation where the op needs one (cross_entropy reads back
// its count of non-ignored targets).
//
//   bench_cuda_ops [--quick] [--csv FILE]
//
// --quick: smaller sizes and fewer repetitions, for smoke runs. --csv FILE: the same rows as
// comma-separated values. Exit status 0, or 1 when some case failed (its error is printed and
// the remaining cases still run). Without a CUDA device it prints "no CUDA device: skipped".
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/elementwise.h"
#include "core/native/fused_optim.h"
#include "core/native/nn_functional.h"
#include "core/native/normalization.h"
#include "core/native/reduce.h"
#include "kernels/cuda/cuda_runtime.h"
#include "tracking/progress.h"

using namespace ember;

namespace {

constexpr int kWarmup = 3;
// The b.group(...) calls in main, for the progress bar's total.
constexpr int64_t kGroups = 12;

struct Options {
  bool quick = false;
  std::string csv;
};

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

const char* short_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    default: return "bool";
  }
}

double esize(DType t) { return double(dtype_size(t)); }

std::string dims(std::initializer_list<int64_t> sizes) {
  std::string s;
  for (const int64_t n : sizes) {
    if (!s.empty()) s += 'x';
    s += std::to_string(n);
  }
  return s;
}

Device gpu() { return Device::cuda(0); }

// N(0, 1) values of `dtype` on the GPU (drawn in f32, then converted).
Tensor gpu_randn(const Shape& shape, DType dtype) {
  const Tensor t = randn(shape, {DType::f32, gpu()});
  return dtype == DType::f32 ? t : t.to(dtype);
}

class Bench {
 public:
  Bench(const Options& opt, int64_t groups)
      : opt_(opt), reps_(opt.quick ? 5 : 20), bar_("bench_cuda_ops", groups, "group") {
    stream_ = cuda::current_stream();
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
    int l2 = 0;
    check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), "cudaDeviceGetAttribute");
    flush_bytes_ = std::max<int64_t>(2 * int64_t(l2), int64_t(256) << 20);
    flush_ = empty({flush_bytes_}, {DType::boolean, gpu()});
    if (!opt.csv.empty()) {
      csv_ = std::fopen(opt.csv.c_str(), "w");
      if (csv_ == nullptr) {
        std::fprintf(stderr, "cannot open %s for writing: %s\n", opt.csv.c_str(), std::strerror(errno));
        std::exit(2);
      }
      std::fprintf(csv_, "op,dtype,shape,time_us,gb_per_s,pct_of_copy\n");
    }
  }
  ~Bench() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    if (csv_ != nullptr) std::fclose(csv_);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  bool quick() const { return opt_.quick; }
  int reps() const { return reps_; }
  int64_t flush_bytes() const { return flush_bytes_; }
  cudaStream_t stream() const { return stream_; }
  int failures() const { return failures_; }
  void set_copy_rate(double gb_per_s) { copy_gbps_ = gb_per_s; }

  // Median microseconds of fn over the timed runs.
  double time_us(const std::function<void()>& fn) {
    for (int i = 0; i < kWarmup; ++i) fn();
    check(cudaStreamSynchronize(stream_), "warm-up");
    std::vector<double> us;
    for (int i = 0; i < reps_; ++i) {
      check(cudaMemsetAsync(flush_.raw_data(), i & 0xff, size_t(flush_bytes_), stream_), "cudaMemsetAsync");
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      fn();
      check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      us.push_back(double(ms) * 1e3);
    }
    std::sort(us.begin(), us.end());
    const size_t m = us.size() / 2;
    return us.size() % 2 == 1 ? us[m] : 0.5 * (us[m - 1] + us[m]);
  }

  // Times fn and prints its row; `bytes` is the least traffic the op needs. Returns GB/s.
  double row(const std::string& op, DType dtype, const std::string& shape, double bytes,
             const std::function<void()>& fn) {
    return print_row(op, dtype, shape, bytes, time_us(fn));
  }

  double print_row(const std::string& op, DType dtype, const std::string& shape, double bytes, double us) {
    const double gbps = bytes / (us * 1e-6) / 1e9;
    const double pct = copy_gbps_ > 0 ? 100.0 * gbps / copy_gbps_ : 0.0;
    char line[160];
    std::snprintf(line, sizeof line, "%-24s %-5s %-24s %11.1f %9.1f %9.1f", op.c_str(), short_name(dtype),
                  shape.c_str(), us, gbps, pct);
    bar_.print(line);
    if (csv_ != nullptr) {
      std::fprintf(csv_, "%s,%s,%s,%.3f,%.3f,%.3f\n", op.c_str(), short_name(dtype), shape.c_str(), us, gbps, pct);
      std::fflush(csv_);
    }
    return gbps;
  }

  // Runs one group of cases; an exception (an op refusing its input, a missing kernel) is
  // reported and counted, and the next group runs.
  void group(const char* name, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: failed: %s\n", name, e.what());
      std::fflush(stderr);
      ++failures_;
    }
    cuda_empty_cache();
    bar_.update(++groups_done_, name);
  }

  void finish() { bar_.finish(); }

 private:
  Options opt_;
  int reps_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  int64_t flush_bytes_ = 0;
  Tensor flush_;
  FILE* csv_ = nullptr;
  double copy_gbps_ = 0;
  int failures_ = 0;
  ProgressBar bar_;
  int64_t groups_done_ = 0;
};

void usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--quick] [--csv FILE]\n", argv0);
}

// BERT fine-tuning AdamW at step 10: lr 1e-4, betas (0.9, 0.999), weight decay 0.01.
native::AdamStepArgs bert_adamw_args() {
  native::AdamStepArgs args{};
  args.lr = 1e-4;
  args.beta1 = 0.9;
  args.beta2 = 0.999;
  args.eps = 1e-8;
  args.weight_decay = 0.01;
  args.decoupled = true;
  args.bias_correction1 = 1.0 - std::pow(args.beta1, 10.0);
  args.bias_correction2 = 1.0 - std::pow(args.beta2, 10.0);
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--csv" && i + 1 < argc) {
      opt.csv = argv[++i];
    } else {
      usage(argv[0]);
      return 2;
    }
  }
  if (!cuda_is_available()) {
    std::printf("no CUDA device: skipped\n");
    return 0;
  }

  Bench b(opt, kGroups);
  const bool q = b.quick();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, L2 %.0f MiB; warm-up %d, median of %d, L2 flushed with %.0f MiB before each run\n",
              prop.name, prop.multiProcessorCount, double(prop.l2CacheSize) / double(1 << 20), kWarmup, b.reps(),
              double(b.flush_bytes()) / double(1 << 20));
  std::printf("%-24s %-5s %-24s %11s %9s %9s\n", "op", "dtype", "shape", "time (us)", "GB/s", "% of copy");

  // ---- copy bandwidth: the reference every other row is measured against
  b.group("copy", [&] {
    const int64_t bytes = q ? int64_t(64) << 20 : int64_t(1) << 30;
    const int64_t n = bytes / 4;
    const Tensor src = gpu_randn({n}, DType::f32);
    const Tensor dst = empty({n}, {DType::f32, gpu()});
    const std::string shape = std::to_string(bytes >> 20) + " MiB";
    // read `bytes` + write `bytes`
    const double moved = 2.0 * double(bytes);
    const double us = b.time_us([&] {
      check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), size_t(bytes), cudaMemcpyDeviceToDevice, b.stream()),
            "cudaMemcpyAsync");
    });
    b.set_copy_rate(moved / (us * 1e-6) / 1e9);
    b.print_row("cudaMemcpyAsync D2D", DType::f32, shape, moved, us);
    // Same traffic through Ember's copy kernel: into an existing tensor, and into a new one.
    b.row("native::copy_", DType::f32, shape, moved, [&] { native::copy_(dst, src); });
    b.row("Tensor::clone", DType::f32, shape, moved, [&] { const Tensor c = src.clone(); });
    // A converting copy f32 -> bf16: read 4n, write 2n.
    const Tensor dst16 = empty({n}, {DType::bf16, gpu()});
    b.row("native::copy_ f32->bf16", DType::bf16, std::to_string(n), double(n) * (4.0 + 2.0),
          [&] { native::copy_(dst16, src); });
  });

  const DType kFloats[] = {DType::f32, DType::bf16};

  // ---- elementwise add: read a and b, write out: 3 * n * esize
  b.group("add", [&] {
    const int64_t n = q ? int64_t(4) << 20 : int64_t(64) << 20;
    for (const DType dt : kFloats) {
      const Tensor x = gpu_randn({n}, dt), y = gpu_randn({n}, dt);
      b.row("add", dt, std::to_string(n), 3.0 * double(n) * esize(dt),
            [&] { const Tensor out = native::binary(native::BinaryOp::Add, x, y); });
    }
  });

  // ---- broadcast add [rows, 768] + [768]: read rows*768 + 768, write rows*768 (times esize)
  b.group("broadcast add", [&] {
    const int64_t rows = q ? 4096 : 8192 * 4, cols = 768;
    for (const DType dt : kFloats) {
      const Tensor x = gpu_randn({rows, cols}, dt), bias = gpu_randn({cols}, dt);
      b.row("add broadcast", dt, dims({rows, cols}) + "+" + std::to_string(cols),
            (2.0 * double(rows * cols) + double(cols)) * esize(dt),
            [&] { const Tensor out = native::binary(native::BinaryOp::Add, x, bias); });
    }
  });

  // ---- GELU (erf) forward: read x, write out: 2 * n * esize
  b.group("gelu", [&] {
    const int64_t n = q ? int64_t(4) << 20 : int64_t(64) << 20;
    for (const DType dt : kFloats) {
      const Tensor x = gpu_randn({n}, dt);
      b.row("gelu", dt, std::to_string(n), 2.0 * double(n) * esize(dt),
            [&] { const Tensor out = native::unary(native::UnaryOp::Gelu, x); });
    }
  });

  // ---- layer norm over rows of 768, f32 weight and bias (the statistics' dtype)
  b.group("layer_norm", [&] {
    const int64_t rows = q ? 4096 : 8192 * 4, cols = 768;
    const Tensor w = gpu_randn({cols}, DType::f32), bias = gpu_randn({cols}, DType::f32);
    for (const DType dt : kFloats) {
      const Tensor x = gpu_randn({rows, cols}, dt), grad = gpu_randn({rows, cols}, dt);
      const double xe = double(rows * cols) * esize(dt);
      // forward: read x, weight, bias; write y, mean, rstd (f32)
      b.row("layer_norm fwd", dt, dims({rows, cols}), 2.0 * xe + 2.0 * double(cols) * 4 + 2.0 * double(rows) * 4,
            [&] { const native::LayerNormResult r = native::layer_norm(x, {cols}, w, bias, 1e-12); });
      const native::LayerNormResult saved = native::layer_norm(x, {cols}, w, bias, 1e-12);
      // backward: read grad, x, mean, rstd, weight; write dx, dweight, dbias
      b.row("layer_norm bwd", dt, dims({rows, cols}), 3.0 * xe + 2.0 * double(rows) * 4 + 3.0 * double(cols) * 4,
            [&] {
              const native::LayerNormGrads g =
                  native::layer_norm_backward(grad, x, {cols}, saved.mean, saved.rstd, w, bias, true, true, true);
            });
    }
  });

  // ---- softmax over the last dim of attention scores [64*12*128, 128]: read x, write y
  b.group("softmax", [&] {
    const int64_t rows = q ? 8 * 12 * 128 : 64 * 12 * 128, cols = 128;
    for (const DType dt : {DType::bf16, DType::f32}) {
      const Tensor x = gpu_randn({rows, cols}, dt);
      b.row("softmax fwd", dt, dims({rows, cols}), 2.0 * double(rows * cols) * esize(dt),
            [&] { const Tensor y = native::softmax(x, -1); });
    }
  });

  // ---- cross entropy forward on MLM logits [8192, 30522] bf16, mean reduction:
  // read logits and the i64 targets; write lse (f32 per row) and the one-element loss
  b.group("cross_entropy", [&] {
    const int64_t rows = q ? 1024 : 8192, classes = 30522;
    const DType dt = DType::bf16;
    const Tensor logits = gpu_randn({rows, classes}, dt);
    const Tensor target = randint(0, classes, {rows}, {DType::i64, gpu()});
    const native::CrossEntropyArgs args;
    b.row("cross_entropy fwd", dt, dims({rows, classes}),
          double(rows * classes) * esize(dt) + double(rows) * 8 + double(rows) * 4 + esize(dt),
          [&] { const native::CrossEntropyResult r = native::cross_entropy(logits, target, args); });
  });

  // ---- dropout p = 0.1: read x; write out and the bool mask (1 byte per element)
  b.group("dropout", [&] {
    const int64_t n = q ? int64_t(4) << 20 : int64_t(64) << 20;
    for (const DType dt : kFloats) {
      const Tensor x = gpu_randn({n}, dt);
      b.row("dropout p=0.1", dt, std::to_string(n), 2.0 * double(n) * esize(dt) + double(n),
            [&] { const native::DropoutResult r = native::dropout(x, 0.1); });
    }
  });

  // ---- AdamW step on one 110M-element f32 parameter (BERT-base size), grads f32 or bf16:
  // param, exp_avg, exp_avg_sq read and written (3 * 2 * 4 bytes), grad read (esize)
  b.group("adam_step", [&] {
    const int64_t n = q ? int64_t(8) << 20 : int64_t(110) * 1000 * 1000;
    const native::AdamStepArgs args = bert_adamw_args();
    const Tensor param = gpu_randn({n}, DType::f32);
    const Tensor exp_avg = zeros({n}, {DType::f32, gpu()}), exp_avg_sq = zeros({n}, {DType::f32, gpu()});
    for (const DType gt : kFloats) {
      const Tensor grad = gpu_randn({n}, gt);
      b.row("adam_step (AdamW)", gt, std::to_string(n), double(n) * (24.0 + esize(gt)),
            [&] { native::adam_step(param, grad, exp_avg, exp_avg_sq, args); });
    }
  });

  // ---- the same AdamW step over BERT-base's parameter list (~200 tensors, ~110M elements, 2
  // encoder layers instead of 12 with --quick): one adam_step per tensor, then all of them in one
  // adam_multi_step call. Bytes as for adam_step, summed over the list.
  b.group("adam_multi_step", [&] {
    const int64_t h = 768, f = 3072, vocab = 30522, layers = q ? 2 : 12;
    std::vector<Shape> shapes = {{vocab, h}, {512, h}, {2, h}, {h}, {h}};  // embeddings + their LayerNorm
    for (int64_t l = 0; l < layers; ++l) {
      for (int k = 0; k < 4; ++k) {  // Q, K, V, attention output
        shapes.push_back({h, h});
        shapes.push_back({h});
      }
      shapes.push_back({h});  // LayerNorm weight, bias
      shapes.push_back({h});
      shapes.push_back({f, h});
      shapes.push_back({f});
      shapes.push_back({h, f});
      shapes.push_back({h});
      shapes.push_back({h});  // LayerNorm weight, bias
      shapes.push_back({h});
    }
    for (const Shape& s : {Shape{h, h}, Shape{h}, Shape{h, h}, Shape{h}, Shape{h}, Shape{h}, Shape{vocab}})
      shapes.push_back(s);  // pooler, MLM transform + LayerNorm, decoder bias (weight tied)
    int64_t total = 0;
    for (const Shape& s : shapes) total += numel_of(s);
    const native::AdamStepArgs args = bert_adamw_args();
    const std::string label = std::to_string(total) + " (" + std::to_string(shapes.size()) + " tensors)";
    for (const DType gt : kFloats) {
      std::vector<native::AdamTensors> list;
      for (const Shape& s : shapes) {
        list.push_back({gpu_randn(s, DType::f32), gpu_randn(s, gt), zeros(s, {DType::f32, gpu()}),
                        zeros(s, {DType::f32, gpu()})});
      }
      const double bytes = double(total) * (24.0 + esize(gt));
      b.row("adam_step per tensor", gt, label, bytes, [&] {
        for (const native::AdamTensors& t : list) native::adam_step(t.param, t.grad, t.exp_avg, t.exp_avg_sq, args);
      });
      b.row("adam_multi_step", gt, label, bytes, [&] { native::adam_multi_step(list, args); });
    }
  });

  // ---- sum over rows ([R, C] -> [R]) and over columns ([R, C] -> [C], a bias gradient) of
  // the FFN activations [8192*4, 3072]: read R*C, write the result (all in the input's dtype)
  b.group("sum", [&] {
    const int64_t rows = q ? 4096 : 8192 * 4, cols = 3072;
    for (const DType dt : kFloats) {
      const Tensor x = gpu_randn({rows, cols}, dt);
      const double in = double(rows * cols) * esize(dt);
      b.row("sum over rows (dim 1)", dt, dims({rows, cols}), in + double(rows) * esize(dt),
            [&] { const Tensor s = native::sum(x, {1}, false); });
      b.row("sum over cols (dim 0)", dt, dims({rows, cols}), in + double(cols) * esize(dt),
            [&] { const Tensor s = native::sum(x, {0}, false); });
    }
  });

  // ---- embedding, vocab 30522 x 768, 8192 i64 indices
  b.group("embedding", [&] {
    const int64_t vocab = 30522, dim = 768, n = q ? 1024 : 8192;
    const Tensor indices = randint(0, vocab, {n}, {DType::i64, gpu()});
    for (const DType dt : kFloats) {
      const Tensor weight = gpu_randn({vocab, dim}, dt), grad = gpu_randn({n, dim}, dt);
      // forward: read the indices and the n gathered rows, write n rows
      b.row("embedding fwd", dt, dims({vocab, dim}) + "[" + std::to_string(n) + "]",
            double(n) * 8 + 2.0 * double(n * dim) * esize(dt),
            [&] { const Tensor out = native::embedding(weight, indices); });
      // backward: read the indices and grad [n, dim]; write the whole gradient [vocab, dim]
      // once (its zero rows are part of the result)
      b.row("embedding bwd", dt, dims({vocab, dim}) + "[" + std::to_string(n) + "]",
            double(n) * 8 + double(n * dim) * esize(dt) + double(vocab * dim) * esize(dt),
            [&] { const Tensor gw = native::embedding_backward(grad, indices, vocab, -1); });
    }
  });

  b.finish();
  if (b.failures() > 0) {
    std::fprintf(stderr, "%d case group(s) failed\n", b.failures());
    return 1;
  }
  return 0;
}
