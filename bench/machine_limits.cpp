// This machine's limits, measured: the denominators every kernel figure is stated against.
//
//   machine_limits                    # table on stdout
//   machine_limits --json limits.json # the same figures as a JSON object with stable keys
//   machine_limits --quick            # short runs (seconds), for tests
//   machine_limits --threads 4        # thread count of the all-cores rows (default: the CPUs
//                                     # this process may run on)
//
// What it runs (bench/README.md, "Machine limits", says more):
//  - f32 FMA peak: an unrolled loop of independent vfmadd chains, AVX2 (ymm) always, AVX-512F
//    (zmm) where the CPU has it; one FMA lane = 2 flops.
//  - bf16 vdpbf16ps peak (AVX512-BF16): 16 lanes x 2 products = 64 flops per instruction.
//  - bf16 AMX tdpbf16ps peak: 16 x 16 x 32 multiply-adds = 16384 flops per instruction, after
//    asking Linux for the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM).
//  - copy bandwidth (read + write bytes: a copy of B bytes counts 2B) and read bandwidth (a sum
//    over the buffer), from working sets that fit L1, L2, L3 and from main memory.
// Every figure is measured on one thread and on all threads (one per CPU, pinned, each with its
// own buffers), repeated, and reported as the best repetition and the median one.
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu_features.h"

namespace {

using Clock = std::chrono::steady_clock;

// ============================================================================ compute kernels
// Each runs `iters` iterations of independent accumulator chains and returns a value that
// depends on all of them, so that nothing can be left out.

constexpr int kAvx2Chains = 12;    // 16 ymm registers: 12 accumulators + 2 operands
constexpr int kAvx512Chains = 24;  // 32 zmm registers
constexpr int kBf16Chains = 24;
constexpr double kFmaAvx2FlopsPerIter = kAvx2Chains * 8 * 2;
constexpr double kFmaAvx512FlopsPerIter = kAvx512Chains * 16 * 2;
constexpr double kBf16FlopsPerIter = kBf16Chains * 16 * 2 * 2;  // 16 lanes x 2 bf16 pairs x 2 flops
constexpr int kAmxTilesC = 4;
constexpr double kAmxFlopsPerInstr = 16.0 * 16.0 * 32.0 * 2.0;
constexpr double kAmxFlopsPerIter = kAmxTilesC * kAmxFlopsPerInstr;

// Sum of the 16 lanes (through memory: _mm512_reduce_add_ps trips GCC 12's -Wuninitialized).
__attribute__((target("avx512f"))) inline float sum16(__m512 v) {
  alignas(64) float out[16];
  _mm512_store_ps(out, v);
  float s = 0;
  for (const float x : out) s += x;
  return s;
}

// acc = acc * m + b converges to b / (1 - m) = 1: no overflow, no denormals.
__attribute__((noinline)) float fma_avx2(int64_t iters) {
  __m256 acc[kAvx2Chains];
  for (int c = 0; c < kAvx2Chains; ++c) acc[c] = _mm256_set1_ps(0.01f * float(c));
  const __m256 m = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kAvx2Chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, b);
  }
  __m256 s = acc[0];
  for (int c = 1; c < kAvx2Chains; ++c) s = _mm256_add_ps(s, acc[c]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[7];
}

__attribute__((noinline, target("avx512f"))) float fma_avx512(int64_t iters) {
  __m512 acc[kAvx512Chains];
  for (int c = 0; c < kAvx512Chains; ++c) acc[c] = _mm512_set1_ps(0.01f * float(c));
  const __m512 m = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 32
    for (int c = 0; c < kAvx512Chains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, b);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kAvx512Chains; ++c) s = _mm512_add_ps(s, acc[c]);
  return sum16(s);
}

// vdpbf16ps: acc[i] += a[2i] * b[2i] + a[2i+1] * b[2i+1] for 16 f32 lanes.
__attribute__((noinline, target("avx512f,avx512bf16"))) float dpbf16_avx512(int64_t iters) {
  __m512 acc[kBf16Chains];
  for (int c = 0; c < kBf16Chains; ++c) acc[c] = _mm512_setzero_ps();
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.002f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.003f), _mm512_set1_ps(0.001f));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 32
    for (int c = 0; c < kBf16Chains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kBf16Chains; ++c) s = _mm512_add_ps(s, acc[c]);
  return sum16(s);
}

// The 64-byte tile configuration of palette 1 (Intel SDM, LDTILECFG).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

// Tiles 0-3 accumulate C (16 x 16 f32); 4, 5 hold A and 6, 7 hold B (16 rows x 32 bf16 each).
// Each iteration is four independent tdpbf16ps, one per accumulator. The tile configuration is
// per thread, so each thread loads it here.
__attribute__((noinline, target("amx-tile,amx-bf16"))) float amx_bf16(int64_t iters) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t ab[16 * 32];
  for (auto& v : ab) v = 0x3A83;  // bf16 of about 0.001
  alignas(64) float c[16 * 16];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float sum = 0;
  _tile_stored(0, c, 64);
  sum += c[0];
  _tile_stored(1, c, 64);
  sum += c[17];
  _tile_stored(2, c, 64);
  sum += c[34];
  _tile_stored(3, c, 64);
  sum += c[255];
  _tile_release();
  return sum;
}

// Linux keeps AMX tile data off until the process asks for it (5.16 and later).
std::optional<std::string> request_amx_permission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return std::nullopt;
  const int err = errno;
  return std::string("Linux refused the AMX tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): ") +
         std::strerror(err) + "; Linux 5.16 or later grants it)";
}

// ============================================================================ memory kernels
// Buffers are 64-byte aligned and sizes multiples of 256 bytes.

__attribute__((noinline)) float copy_avx2(const float* src, float* dst, size_t n, int64_t passes) {
  for (int64_t p = 0; p < passes; ++p) {
    for (size_t i = 0; i < n; i += 32) {
      const __m256 a = _mm256_load_ps(src + i), b = _mm256_load_ps(src + i + 8);
      const __m256 c = _mm256_load_ps(src + i + 16), d = _mm256_load_ps(src + i + 24);
      _mm256_store_ps(dst + i, a);
      _mm256_store_ps(dst + i + 8, b);
      _mm256_store_ps(dst + i + 16, c);
      _mm256_store_ps(dst + i + 24, d);
    }
    asm volatile("" ::: "memory");  // every pass is a real copy
  }
  return dst[n / 2];
}

__attribute__((noinline, target("avx512f"))) float copy_avx512(const float* src, float* dst, size_t n,
                                                              int64_t passes) {
  for (int64_t p = 0; p < passes; ++p) {
    for (size_t i = 0; i < n; i += 64) {
      const __m512 a = _mm512_load_ps(src + i), b = _mm512_load_ps(src + i + 16);
      const __m512 c = _mm512_load_ps(src + i + 32), d = _mm512_load_ps(src + i + 48);
      _mm512_store_ps(dst + i, a);
      _mm512_store_ps(dst + i + 16, b);
      _mm512_store_ps(dst + i + 32, c);
      _mm512_store_ps(dst + i + 48, d);
    }
    asm volatile("" ::: "memory");
  }
  return dst[n / 2];
}

__attribute__((noinline)) float read_avx2(const float* src, size_t n, int64_t passes) {
  __m256 s[8];
  for (auto& v : s) v = _mm256_setzero_ps();
  for (int64_t p = 0; p < passes; ++p) {
    for (size_t i = 0; i < n; i += 64) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) s[k] = _mm256_add_ps(s[k], _mm256_load_ps(src + i + 8 * k));
    }
    asm volatile("" ::: "memory");
  }
  for (int k = 1; k < 8; ++k) s[0] = _mm256_add_ps(s[0], s[k]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s[0]);
  return out[0] + out[5];
}

__attribute__((noinline, target("avx512f"))) float read_avx512(const float* src, size_t n, int64_t passes) {
  __m512 s[8];
  for (auto& v : s) v = _mm512_setzero_ps();
  for (int64_t p = 0; p < passes; ++p) {
    for (size_t i = 0; i < n; i += 128) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) s[k] = _mm512_add_ps(s[k], _mm512_load_ps(src + i + 16 * k));
    }
    asm volatile("" ::: "memory");
  }
  for (int k = 1; k < 8; ++k) s[0] = _mm512_add_ps(s[0], s[k]);
  return sum16(s[0]);
}

// ============================================================================ threads and timing

struct alignas(64) Sink {
  volatile float value = 0;
};

// The CPUs this process may run on; thread i is pinned to cpus[i % size].
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty())
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c) cpus.push_back(int(c));
  return cpus;
}

struct RunTimes {
  double wall = 0;     // from the first thread's start to the last thread's end
  double slowest = 0;  // the longest time one thread spent in its body
};

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // best effort
}

// Runs body(thread) on n threads pinned to distinct CPUs and released together; the calling
// thread is thread 0 (so that no thread spins while the one that would release them waits for a
// CPU). The caller's affinity is restored afterwards. A run of one thread is not pinned: on a
// shared machine the scheduler then moves it to whichever CPU is free.
RunTimes run_threads(int n, const std::vector<int>& cpus, const std::function<void(int)>& body) {
  cpu_set_t saved;
  const bool have_saved = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Clock::time_point> start(static_cast<size_t>(n)), end(static_cast<size_t>(n));
  auto run = [&](int t) {
    start[size_t(t)] = Clock::now();
    body(t);
    end[size_t(t)] = Clock::now();
  };
  std::vector<std::thread> pool;
  pool.reserve(size_t(n));
  for (int t = 1; t < n; ++t) {
    pool.emplace_back([&, t] {
      pin_to(cpus[size_t(t) % cpus.size()]);
      ready.fetch_add(1);
      for (int spins = 0; !go.load(std::memory_order_acquire); ++spins) {
        _mm_pause();
        if (spins % 1024 == 1023) std::this_thread::yield();
      }
      run(t);
    });
  }
  if (n > 1) pin_to(cpus[0]);
  while (ready.load() < n - 1) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  run(0);
  for (auto& th : pool) th.join();
  if (n > 1 && have_saved) pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
  RunTimes r;
  const auto first = *std::min_element(start.begin(), start.end());
  const auto last = *std::max_element(end.begin(), end.end());
  r.wall = std::chrono::duration<double>(last - first).count();
  for (int t = 0; t < n; ++t)
    r.slowest = std::max(r.slowest, std::chrono::duration<double>(end[size_t(t)] - start[size_t(t)]).count());
  return r;
}

struct Options {
  bool quick = false;
  int threads = 0;
  std::string json_path;
};

struct Stat {
  double best = 0, median = 0;  // rates (GFLOP/s or GB/s) of the fastest and the median repetition
  bool ok = false;
};

// work(thread, iters) does `iters` units on that thread; units_per_iter is per thread (flops or
// bytes). Iterations are calibrated so that one repetition takes about the target time.
Stat measure(int threads, const std::vector<int>& cpus, const Options& o, double units_per_iter,
             const std::function<void(int, int64_t)>& work) {
  const double target_s = o.quick ? 0.01 : 0.05;
  const int reps = o.quick ? 5 : 7;
  // calibrate on the slowest thread's own time: a thread that starts late (the machine is
  // shared) must not make the repetitions short
  int64_t iters = 1;
  double t = 0;
  for (;;) {
    t = run_threads(threads, cpus, [&](int th) { work(th, iters); }).slowest;
    if (t >= target_s / 4 || iters > (int64_t(1) << 40)) break;
    iters *= t < target_s / 64 ? 8 : 2;
  }
  iters = std::max<int64_t>(1, int64_t(double(iters) * target_s / t));
  // a repetition's rate: all threads' work over the wall time from the first start to the last end
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const double s = run_threads(threads, cpus, [&](int th) { work(th, iters); }).wall;
    rates.push_back(units_per_iter * double(iters) * threads / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return {rates.back(), rates[(rates.size() - 1) / 2], true};
}

// ============================================================================ caches

struct CacheLevel {
  size_t bytes = 0;
  int sharers = 1;  // CPUs sharing one instance
  bool from_sysfs = false;
};

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  const unsigned long long v = std::stoull(s, &pos);
  const char unit = pos < s.size() ? s[pos] : ' ';
  if (unit == 'K') return size_t(v) << 10;
  if (unit == 'M') return size_t(v) << 20;
  if (unit == 'G') return size_t(v) << 30;
  return size_t(v);
}

int count_cpu_list(const std::string& list) {  // "0-3,8" -> 5
  int n = 0;
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty()) continue;
    const auto dash = part.find('-');
    n += dash == std::string::npos ? 1 : std::stoi(part.substr(dash + 1)) - std::stoi(part.substr(0, dash)) + 1;
  }
  return std::max(1, n);
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// [0] L1d, [1] L2, [2] L3, from /sys/devices/system/cpu/cpu0/cache/index*/; defaults where absent.
std::vector<CacheLevel> read_caches() {
  std::vector<CacheLevel> c = {{32u << 10, 1, false}, {1u << 20, 1, false}, {16u << 20, 1, false}};
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string level = read_line(dir + "level"), type = read_line(dir + "type"), size = read_line(dir + "size");
    if (level.empty() || size.empty()) continue;
    if (type == "Instruction") continue;
    const int l = std::atoi(level.c_str());
    if (l < 1 || l > 3) continue;
    try {
      CacheLevel& slot = c[size_t(l - 1)];
      slot.bytes = parse_size(size);
      const std::string shared = read_line(dir + "shared_cpu_list");
      slot.sharers = shared.empty() ? 1 : count_cpu_list(shared);
      slot.from_sysfs = slot.bytes > 0;
    } catch (const std::exception&) {
    }
  }
  return c;
}

std::string human_bytes(size_t b) {
  char buf[32];
  if (b >= (size_t(1) << 30) && b % (size_t(1) << 30) == 0) std::snprintf(buf, sizeof buf, "%zu GiB", b >> 30);
  else if (b >= (size_t(1) << 20) && b % (size_t(1) << 20) == 0) std::snprintf(buf, sizeof buf, "%zu MiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0) std::snprintf(buf, sizeof buf, "%zu KiB", b >> 10);
  else std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

// ============================================================================ output

std::string json_num(const Stat& s, bool median = false) {
  if (!s.ok) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", median ? s.median : s.best);
  return buf;
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

std::string cell(const Stat& s) {
  if (!s.ok) return "";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%9.1f %9.1f", s.best, s.median);
  return buf;
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "machine_limits: %s (see --help)\n", msg.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      std::printf(
          "usage: machine_limits [--quick] [--threads N] [--json FILE]\n"
          "  Measures this machine's f32 FMA, bf16 (AVX512-BF16, AMX) peaks and its copy/read bandwidth\n"
          "  from L1, L2, L3 and memory, on 1 thread and on all threads; prints a table.\n"
          "  --quick      short repetitions (seconds in all), for tests\n"
          "  --threads N  threads of the all-cores rows (default: the CPUs this process may use)\n"
          "  --json FILE  also write the figures to FILE as one JSON object\n");
      std::exit(0);
    } else if (k == "--quick") {
      o.quick = true;
    } else if (k == "--threads" || k == "--json") {
      if (i + 1 >= argc || argv[i + 1][0] == '\0') usage_error(k + " needs a value");
      const std::string v = argv[++i];
      if (k == "--json") {
        o.json_path = v;
      } else {
        char* end = nullptr;
        errno = 0;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (errno != 0 || *end != '\0' || n < 1 || n > 4096)
          usage_error("--threads needs a whole number from 1 to 4096, got '" + v + "'");
        o.threads = int(n);
      }
    } else {
      usage_error("unknown option '" + k + "'");
    }
  }
  return o;
}

struct Level {
  const char* key = "";   // JSON key
  const char* name = "";  // table name
  size_t ws1 = 0;    // working set (bytes) of the 1-thread run
  size_t wsall = 0;  // working set per thread of the all-threads run
  Stat copy1, copyall, read1, readall;
};

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  const ember::CpuFeatures& f = ember::cpu_features();
  const std::vector<int> cpus = allowed_cpus();
  const int threads = opt.threads > 0 ? opt.threads : int(cpus.size());
  const std::vector<CacheLevel> caches = read_caches();
  std::vector<Sink> sinks(size_t(threads) + 1);

  if (!f.avx2 || !f.fma) {
    std::fprintf(stderr, "machine_limits: this CPU lacks AVX2 or FMA, the baseline this program is built for\n");
    return 1;
  }

  std::string isa;
  for (const auto& [name, on] : ember::cpu_feature_list()) isa += (isa.empty() ? "" : " ") + name + (on ? "" : ":no");
  std::printf("machine_limits: measured limits of this machine\n");
  std::printf("  CPU      %s\n", ember::cpu_model_name().c_str());
  std::printf("  threads  %zu CPUs usable by this process; all-threads rows use %d thread%s, pinned one per CPU (1-thread rows: unpinned)%s\n",
              cpus.size(), threads, threads == 1 ? "" : "s",
              threads > int(cpus.size()) ? " (more threads than CPUs: oversubscribed)" : "");
  std::printf("  ISA      %s\n", isa.c_str());
  std::printf("  caches   L1d %s, L2 %s (shared by %d CPU%s), L3 %s (shared by %d CPU%s)%s\n",
              human_bytes(caches[0].bytes).c_str(), human_bytes(caches[1].bytes).c_str(), caches[1].sharers,
              caches[1].sharers == 1 ? "" : "s", human_bytes(caches[2].bytes).c_str(), caches[2].sharers,
              caches[2].sharers == 1 ? "" : "s",
              (caches[0].from_sysfs && caches[1].from_sysfs && caches[2].from_sysfs)
                  ? " (from /sys/devices/system/cpu/cpu0/cache)"
                  : " (some are defaults: not in /sys/devices/system/cpu/cpu0/cache)");
  std::printf("  method   best and median of %d repetitions of about %d ms each, after calibration\n",
              opt.quick ? 5 : 7, opt.quick ? 10 : 50);
  std::fflush(stdout);

  // ---- compute peaks
  auto compute = [&](double flops_per_iter, float (*kernel)(int64_t), Stat& one, Stat& all) {
    auto work = [&](int th, int64_t iters) { sinks[size_t(th)].value = kernel(iters); };
    one = measure(1, cpus, opt, flops_per_iter, work);
    all = measure(threads, cpus, opt, flops_per_iter, work);
  };
  Stat fma2_1, fma2_all, fma512_1, fma512_all, bf16_1, bf16_all, amx_1, amx_all;
  compute(kFmaAvx2FlopsPerIter, fma_avx2, fma2_1, fma2_all);
  if (f.avx512f) compute(kFmaAvx512FlopsPerIter, fma_avx512, fma512_1, fma512_all);
  if (f.avx512_bf16) compute(kBf16FlopsPerIter, dpbf16_avx512, bf16_1, bf16_all);
  std::optional<std::string> amx_note;
  if (f.amx_bf16) {
    amx_note = request_amx_permission();
    if (!amx_note) compute(kAmxFlopsPerIter, amx_bf16, amx_1, amx_all);
  }
  const bool fma_avx512_best = fma512_1.ok && fma512_1.best > fma2_1.best;
  const Stat& fma_1 = fma_avx512_best ? fma512_1 : fma2_1;
  const Stat& fma_all = fma_avx512_best ? fma512_all : fma2_all;
  const char* bf16_source = amx_1.ok ? "amx" : bf16_1.ok ? "vdpbf16ps" : "fma_f32";
  const Stat& bf16_peak = amx_1.ok ? amx_1 : bf16_1.ok ? bf16_1 : fma_1;

  // ---- bandwidth: one block per thread, sized for main memory, written by its own thread first.
  // Main memory: 4x the L3 (2x with --quick) on one thread; on all threads, enough per thread that
  // together they exceed every L3 instance sharing them as many times over.
  const CacheLevel& l3 = caches[2];
  const size_t factor = opt.quick ? 2 : 4;
  const size_t mem_ws1 = std::max<size_t>(factor * l3.bytes, size_t(opt.quick ? 32 : 64) << 20);
  const size_t mem_wsall = std::max<size_t>(factor * l3.bytes / size_t(std::min(threads, l3.sharers)),
                                            size_t(opt.quick ? 8 : 16) << 20);
  auto round_ws = [](size_t b) { return std::max<size_t>(512, b / 512 * 512); };
  std::vector<Level> levels(4);
  const char* const level_keys[] = {"l1", "l2", "l3", "memory"};
  const char* const level_names[] = {"L1", "L2", "L3", "memory"};
  for (size_t i = 0; i < 4; ++i) {
    levels[i].key = level_keys[i];
    levels[i].name = level_names[i];
  }
  // L3: half of it, but at most kL3WorkingSetCap: a virtual machine may report its host's whole
  // L3 (260 MiB seen), of which a guest keeps far less; past the cap the run measures memory.
  constexpr size_t kL3WorkingSetCap = size_t(16) << 20;
  for (size_t i = 0; i < 3; ++i) {
    const size_t half = i == 2 ? std::min(caches[i].bytes / 2, kL3WorkingSetCap) : caches[i].bytes / 2;
    levels[i].ws1 = round_ws(half);
    levels[i].wsall = round_ws(half / size_t(std::min(threads, caches[i].sharers)));
  }
  levels[3].ws1 = round_ws(mem_ws1);
  levels[3].wsall = round_ws(mem_wsall);
  constexpr size_t kHuge = size_t(2) << 20;
  auto huge_round = [&](size_t b) { return (b + kHuge - 1) / kHuge * kHuge; };
  // thread 0 also runs the 1-thread figures
  std::vector<size_t> block_bytes(size_t(threads), huge_round(levels[3].wsall));
  block_bytes[0] = huge_round(std::max(levels[3].ws1, levels[3].wsall));
  std::vector<float*> blocks(size_t(threads), nullptr);
  for (size_t t = 0; t < blocks.size(); ++t) {
    blocks[t] = static_cast<float*>(std::aligned_alloc(kHuge, block_bytes[t]));
    if (blocks[t] == nullptr) {
      std::fprintf(stderr, "machine_limits: cannot allocate %s for thread %zu's bandwidth runs\n",
                   human_bytes(block_bytes[t]).c_str(), t);
      return 1;
    }
    madvise(blocks[t], block_bytes[t], MADV_HUGEPAGE);  // fewer page faults and TLB misses where THP allows
  }
  run_threads(threads, cpus, [&](int th) {
    float* b = blocks[size_t(th)];
    for (size_t i = 0; i < block_bytes[size_t(th)] / sizeof(float); ++i) b[i] = float(i & 1023) * 0.001f;
  });
  const bool wide = f.avx512f;
  for (Level& lv : levels) {
    auto copy_work = [&](size_t ws) {
      return [&, ws](int th, int64_t passes) {
        const size_t n = ws / 2 / sizeof(float);
        float* b = blocks[size_t(th)];
        sinks[size_t(th)].value = wide ? copy_avx512(b, b + n, n, passes) : copy_avx2(b, b + n, n, passes);
      };
    };
    auto read_work = [&](size_t ws) {
      return [&, ws](int th, int64_t passes) {
        const size_t n = ws / sizeof(float);
        sinks[size_t(th)].value = wide ? read_avx512(blocks[size_t(th)], n, passes)
                                       : read_avx2(blocks[size_t(th)], n, passes);
      };
    };
    // copy: ws/2 bytes read and ws/2 written per pass, counted as ws bytes
    lv.copy1 = measure(1, cpus, opt, double(lv.ws1), copy_work(lv.ws1));
    lv.copyall = measure(threads, cpus, opt, double(lv.wsall), copy_work(lv.wsall));
    lv.read1 = measure(1, cpus, opt, double(lv.ws1), read_work(lv.ws1));
    lv.readall = measure(threads, cpus, opt, double(lv.wsall), read_work(lv.wsall));
  }
  for (auto* b : blocks) std::free(b);

  // ---- table
  const std::string all_hdr = std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  std::printf("\n%-40s   %-19s   %-19s\n", "compute, GFLOP/s (FMA lane = 2 flops)", "1 thread", all_hdr.c_str());
  std::printf("%-40s   %9s %9s   %9s %9s\n", "", "best", "median", "best", "median");
  auto crow = [&](const std::string& name, const Stat& one, const Stat& all, const std::string& why) {
    if (one.ok)
      std::printf("%-40s   %s   %s\n", name.c_str(), cell(one).c_str(), cell(all).c_str());
    else
      std::printf("%-40s   %s\n", name.c_str(), why.c_str());
  };
  crow("f32 FMA, AVX2 (ymm, " + std::to_string(kAvx2Chains) + " chains)", fma2_1, fma2_all, "");
  crow("f32 FMA, AVX-512F (zmm, " + std::to_string(kAvx512Chains) + " chains)", fma512_1, fma512_all,
       "not available on this CPU");
  crow("bf16 vdpbf16ps (64 flops/instr)", bf16_1, bf16_all, "not available on this CPU");
  crow("bf16 AMX tdpbf16ps (16384 flops/instr)", amx_1, amx_all,
       f.amx_bf16 ? amx_note.value_or("") : std::string("not available on this CPU"));

  std::printf("\n%-34s   %-19s   %-19s   %-19s   %-19s\n", "bandwidth, GB/s (1e9 B/s)", "copy, 1 thread",
              ("copy, " + all_hdr).c_str(), "read, 1 thread", ("read, " + all_hdr).c_str());
  std::printf("%-8s %12s %12s   %9s %9s   %9s %9s   %9s %9s   %9s %9s\n", "level", "working set", "per thread",
              "best", "median", "best", "median", "best", "median", "best", "median");
  for (const Level& lv : levels)
    std::printf("%-8s %12s %12s   %s   %s   %s   %s\n", lv.name, human_bytes(lv.ws1).c_str(),
                human_bytes(lv.wsall).c_str(), cell(lv.copy1).c_str(), cell(lv.copyall).c_str(), cell(lv.read1).c_str(),
                cell(lv.readall).c_str());
  const std::string bf16_what = std::string(bf16_source) == "amx"         ? "the AMX tdpbf16ps peak"
                                : std::string(bf16_source) == "vdpbf16ps" ? "the vdpbf16ps peak"
                                                                          : "the f32 FMA peak, no bf16 unit here";
  std::printf(
      "\ncopy counts read + write bytes (a copy of B bytes moves 2B; the working set is source + destination),\n"
      "with ordinary %s stores (write-allocate reads are not counted); read sums the working set.\n"
      "The all-threads runs give each thread its own buffers (L1/L2/L3: the cache divided among the\n"
      "threads that share it); 'working set' is the 1-thread run's, 'per thread' the all-threads run's.\n"
      "MFU denominators: f32, the f32 FMA peak per core (%s, %.1f GFLOP/s); bf16, %s (%.1f GFLOP/s per core).\n",
      wide ? "zmm" : "ymm", fma_avx512_best ? "AVX-512F" : "AVX2", fma_1.best, bf16_what.c_str(), bf16_peak.best);

  // ---- JSON
  if (!opt.json_path.empty()) {
    std::ostringstream j;
    auto bw = [&](bool median, bool read) {
      std::string s = "{";
      for (size_t i = 0; i < levels.size(); ++i) {
        const Level& lv = levels[i];
        s += std::string(i ? ", " : "") + "\"" + lv.key + "\": {\"1\": " + json_num(read ? lv.read1 : lv.copy1, median) +
             ", \"all\": " + json_num(read ? lv.readall : lv.copyall, median) + "}";
      }
      return s + "}";
    };
    auto bool_s = [](bool b) { return b ? "true" : "false"; };
    j << "{\n";
    j << "  \"cpu\": " << json_str(ember::cpu_model_name()) << ",\n";
    j << "  \"threads\": " << threads << ",\n";
    j << "  \"cpus_usable\": " << cpus.size() << ",\n";
    j << "  \"quick\": " << bool_s(opt.quick) << ",\n";
    j << "  \"repetitions\": " << (opt.quick ? 5 : 7) << ",\n";
    j << "  \"isa\": {";
    bool first = true;
    for (const auto& [name, on] : ember::cpu_feature_list()) {
      j << (first ? "" : ", ") << "\"" << name << "\": " << bool_s(on);
      first = false;
    }
    j << "},\n";
    j << "  \"cache_bytes\": {\"l1d\": " << caches[0].bytes << ", \"l2\": " << caches[1].bytes
      << ", \"l3\": " << caches[2].bytes << ", \"from_sysfs\": "
      << bool_s(caches[0].from_sysfs && caches[1].from_sysfs && caches[2].from_sysfs) << "},\n";
    j << "  \"fma_isa\": \"" << (fma_avx512_best ? "avx512" : "avx2") << "\",\n";
    j << "  \"fma_f32_gflops_per_core\": " << json_num(fma_1) << ",\n";
    j << "  \"fma_f32_gflops_all_cores\": " << json_num(fma_all) << ",\n";
    j << "  \"fma_f32_avx2_gflops_per_core\": " << json_num(fma2_1) << ",\n";
    j << "  \"fma_f32_avx2_gflops_all_cores\": " << json_num(fma2_all) << ",\n";
    j << "  \"fma_f32_avx512_gflops_per_core\": " << json_num(fma512_1) << ",\n";
    j << "  \"fma_f32_avx512_gflops_all_cores\": " << json_num(fma512_all) << ",\n";
    j << "  \"vdpbf16ps_gflops_per_core\": " << json_num(bf16_1) << ",\n";
    j << "  \"vdpbf16ps_gflops_all_cores\": " << json_num(bf16_all) << ",\n";
    j << "  \"amx_bf16_gflops_per_core\": " << json_num(amx_1) << ",\n";
    j << "  \"amx_bf16_gflops_all_cores\": " << json_num(amx_all) << ",\n";
    j << "  \"amx_bf16_note\": " << (amx_note ? json_str(*amx_note) : "null") << ",\n";
    j << "  \"bf16_peak_source\": \"" << bf16_source << "\",\n";
    j << "  \"bf16_peak_gflops_per_core\": " << json_num(bf16_peak) << ",\n";
    j << "  \"bandwidth_convention\": \"copy: read + write bytes (2x the bytes copied), ordinary stores; read: bytes summed\",\n";
    j << "  \"bandwidth_gbs\": " << bw(false, false) << ",\n";
    j << "  \"read_bandwidth_gbs\": " << bw(false, true) << ",\n";
    j << "  \"working_set_bytes\": {";
    for (size_t i = 0; i < levels.size(); ++i)
      j << (i ? ", " : "") << "\"" << levels[i].key << "\": {\"1\": " << levels[i].ws1 << ", \"all\": " << levels[i].wsall
        << "}";
    j << "},\n";
    j << "  \"median\": {\"fma_f32_gflops_per_core\": " << json_num(fma_1, true)
      << ", \"fma_f32_gflops_all_cores\": " << json_num(fma_all, true)
      << ", \"vdpbf16ps_gflops_per_core\": " << json_num(bf16_1, true)
      << ", \"amx_bf16_gflops_per_core\": " << json_num(amx_1, true) << ", \"bandwidth_gbs\": " << bw(true, false)
      << ", \"read_bandwidth_gbs\": " << bw(true, true) << "}\n";
    j << "}\n";
    std::ofstream out(opt.json_path);
    out << j.str();
    if (!out.good()) {
      std::fprintf(stderr, "machine_limits: cannot write %s\n", opt.json_path.c_str());
      return 1;
    }
  }
  return 0;
}
