// Per-product timing of cpu::gemm's f32 products, for finding where a training step's GEMM time
// goes as the products run there (the same product timed alone can run at another speed: other
// work's data in the caches, the other thread busy). EMBER_GEMM_PROFILE=1 at start-up (or
// set_gemm_profile) times every f32 cpu::gemm and cpu::gemm_bias call and sums the calls by
// shape, layout, kernel and whether they ran inside a parallel region (one thread each, such as
// attention's per-head products); the table, when it has rows, goes to stderr when the process
// exits, largest total first. Off, a product pays one relaxed atomic load.
//
//   EMBER_GEMM_PROFILE=1 build/bench/bert_train --config bert-mini --task cls --steps 10
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ember::cpu {

struct GemmProfileRow {
  int64_t m, n, k;
  bool trans_a, trans_b, bias;
  std::string kernel;     // f32_gemm_path_name of the path it took
  bool in_parallel;       // ran on one thread inside a parallel region
  int64_t calls;
  double seconds;         // summed over the calls (each call's wall time on its thread)
  double gflops() const;  // 2 m n k calls / seconds
};

bool gemm_profile_enabled();
// Turns timing on or off (tests); the EMBER_GEMM_PROFILE variable sets the state at start-up.
void set_gemm_profile(bool on);
// The rows so far, largest total first; clear_gemm_profile empties them.
std::vector<GemmProfileRow> gemm_profile_rows();
void clear_gemm_profile();

// Times one product from construction to destruction when profiling is on (and kernel, the
// path's name, is not null).
class GemmProfileScope {
 public:
  GemmProfileScope(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, bool bias, const char* kernel);
  ~GemmProfileScope();
  GemmProfileScope(const GemmProfileScope&) = delete;
  GemmProfileScope& operator=(const GemmProfileScope&) = delete;

 private:
  bool active_;
  int64_t m_ = 0, n_ = 0, k_ = 0;
  bool trans_a_ = false, trans_b_ = false, bias_ = false;
  const char* kernel_ = nullptr;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ember::cpu
