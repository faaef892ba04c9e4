#include "kernels/cpu/gemm_profile.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/error.h"
#include "core/parallel.h"

namespace ember::cpu {
namespace {

struct Key {
  int64_t m, n, k;
  bool trans_a, trans_b, bias;
  std::string kernel;
  bool in_parallel;
  bool operator<(const Key& o) const {
    return std::tie(m, n, k, trans_a, trans_b, bias, kernel, in_parallel) <
           std::tie(o.m, o.n, o.k, o.trans_a, o.trans_b, o.bias, o.kernel, o.in_parallel);
  }
};

struct Totals {
  int64_t calls = 0;
  double seconds = 0;
};

std::vector<GemmProfileRow> sorted_rows(const std::map<Key, Totals>& table) {
  std::vector<GemmProfileRow> rows;
  for (const auto& [key, totals] : table)
    rows.push_back({key.m, key.n, key.k, key.trans_a, key.trans_b, key.bias, key.kernel, key.in_parallel,
                    totals.calls, totals.seconds});
  std::sort(rows.begin(), rows.end(),
            [](const GemmProfileRow& a, const GemmProfileRow& b) { return a.seconds > b.seconds; });
  return rows;
}

void print(const std::vector<GemmProfileRow>& rows) {
  std::fprintf(stderr,
               "ember GEMM profile (EMBER_GEMM_PROFILE): f32 products, largest total first; M x N x K "
               "(A is M x K); \"1 of a region\": one thread's product inside a parallel region\n");
  std::fprintf(stderr, "%-18s %-8s %-6s %-7s %-12s %8s %11s %9s\n", "MxNxK", "layout", "bias", "kernel", "threads",
               "calls", "total ms", "GFLOP/s");
  for (const GemmProfileRow& r : rows) {
    const std::string shape = std::to_string(r.m) + "x" + std::to_string(r.n) + "x" + std::to_string(r.k);
    const std::string layout = std::string(r.trans_a ? "A^T" : "A") + (r.trans_b ? " B^T" : " B");
    std::fprintf(stderr, "%-18s %-8s %-6s %-7s %-12s %8" PRId64 " %11.2f %9.1f\n", shape.c_str(), layout.c_str(),
                 r.bias ? "bias" : "-", r.kernel.c_str(), r.in_parallel ? "1 of a region" : "all", r.calls,
                 r.seconds * 1e3, r.gflops());
  }
}

// The table; printed at exit when profiling was on at any point.
class Profile {
 public:
  Profile() {
    const char* v = std::getenv("EMBER_GEMM_PROFILE");
    if (v == nullptr || *v == '\0' || std::string(v) == "0") return;
    EMBER_CHECK(std::string(v) == "1", "EMBER_GEMM_PROFILE: expected 0 or 1, got '", v, "'");
    enable(true);
  }
  ~Profile() {
    if (!used_.load(std::memory_order_relaxed)) return;
    const std::vector<GemmProfileRow> table = rows();
    if (!table.empty()) print(table);
  }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void enable(bool on) {
    enabled_.store(on, std::memory_order_relaxed);
    if (on) used_.store(true, std::memory_order_relaxed);
  }
  void add(const Key& key, double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    Totals& t = table_[key];
    t.calls += 1;
    t.seconds += seconds;
  }
  std::vector<GemmProfileRow> rows() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sorted_rows(table_);
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    table_.clear();
  }

 private:
  std::atomic<bool> enabled_{false}, used_{false};
  std::mutex mutex_;
  std::map<Key, Totals> table_;
};

Profile& profile() {
  static Profile p;
  return p;
}

}  // namespace

double GemmProfileRow::gflops() const {
  return seconds > 0 ? 2.0 * double(m) * double(n) * double(k) * double(calls) / seconds * 1e-9 : 0.0;
}

bool gemm_profile_enabled() { return profile().enabled(); }
void set_gemm_profile(bool on) { profile().enable(on); }
std::vector<GemmProfileRow> gemm_profile_rows() { return profile().rows(); }
void clear_gemm_profile() { profile().clear(); }

GemmProfileScope::GemmProfileScope(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, bool bias,
                                   const char* kernel)
    : active_(kernel != nullptr && gemm_profile_enabled()) {
  if (!active_) return;
  m_ = m, n_ = n, k_ = k, trans_a_ = trans_a, trans_b_ = trans_b, bias_ = bias, kernel_ = kernel;
  start_ = std::chrono::steady_clock::now();
}

GemmProfileScope::~GemmProfileScope() {
  if (!active_) return;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  profile().add({m_, n_, k_, trans_a_, trans_b_, bias_, kernel_, in_parallel_region()}, seconds);
}

}  // namespace ember::cpu
