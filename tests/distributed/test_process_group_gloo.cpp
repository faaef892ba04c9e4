// ProcessGroupGloo: every collective, dtype and reduce op against values worked out by hand,
// with ranks as threads (HashStore) and as real processes (pg_worker + TcpStore); dead, stuck
// and missing ranks must become ember::Error on the survivors, never a hang.
#include <algorithm>
#include <regex>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "distributed/collective_fingerprint.h"
#include "distributed/hash_store.h"
#include "distributed/process_group_gloo.h"
#include "distributed/tcp_store.h"
#include "process_test_util.h"
#include "test_util.h"
#if defined(EMBER_WITH_CUDA)
#include "kernels/cuda/cuda_runtime.h"
#endif

namespace ember::distributed {
namespace {

using std::chrono::milliseconds;
using Fn = std::function<void(ProcessGroupGloo&)>;

// Runs fn on `n` ranks, one thread each, sharing a HashStore. Failures inside the threads are
// collected and reported here.
void run_ranks(int n, const Fn& fn, milliseconds timeout = milliseconds(10000), ProcessGroupOptions opt = {}) {
  auto store = std::make_shared<HashStore>(timeout);
  opt.timeout = timeout;
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        ProcessGroupGloo pg(store, r, n, opt);
        fn(pg);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}

// Rank r's value at index i: small integers, exact in every dtype and in their sums.
double value(int r, int64_t i) { return double(i % 7) - 3.0 + double(r) * double(i % 3 + 1); }

Tensor rank_tensor(int r, int64_t len, DType dt) {
  std::vector<double> v(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) v[size_t(i)] = value(r, i);
  return from_vector(v, {len}).to(dt);
}

double expected(ReduceOp op, int n, int64_t i) {
  double acc = value(0, i);
  for (int r = 1; r < n; ++r) {
    const double x = value(r, i);
    acc = op == ReduceOp::Max ? std::max(acc, x) : op == ReduceOp::Min ? std::min(acc, x) : acc + x;
  }
  return op == ReduceOp::Avg ? acc / n : acc;
}

constexpr DType kAllTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64};
constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

TEST(HashStore, SetGetAddCheckWait) {
  HashStore store(milliseconds(200));
  store.set_string("a", "hello");
  EXPECT_EQ(store.get_string("a"), "hello");
  EXPECT_EQ(store.add("n", 3), 3);
  EXPECT_EQ(store.add("n", -5), -2);
  EXPECT_TRUE(store.check({"a", "n"}));
  EXPECT_FALSE(store.check({"a", "missing"}));
  EXPECT_EMBER_ERROR(store.get("missing"), "timed out", "'missing'");
  EXPECT_EMBER_ERROR(store.wait({"a", "other"}), "'other'");
  EXPECT_EMBER_ERROR(store.add("a", 1), "not an integer");
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(20));
    store.set_string("late", "x");
  });
  store.set_timeout(milliseconds(5000));
  EXPECT_EQ(store.get_string("late"), "x");
  late.join();
}

TEST(ProcessGroupGloo, AllreduceEveryDtypeAndOp) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("world " + std::to_string(n));
    run_ranks(n, [n](ProcessGroupGloo& pg) {
      EXPECT_EQ(pg.backend_name(), "gloo");
      for (DType dt : kAllTypes)
        for (ReduceOp op : kAllOps) {
          if (op == ReduceOp::Avg && !is_floating(dt)) continue;
          const int64_t len = 1 + (n * 37 + int(dt) * 11) % 50;
          Tensor x = rank_tensor(pg.rank(), len, dt);
          pg.allreduce(x, op)->wait();
          const auto got = x.to_vector<double>();
          const double tol = (dt == DType::f16 || dt == DType::bf16) ? 1e-2 : 1e-6;
          for (int64_t i = 0; i < len; ++i) {
            const double want = expected(op, n, i);
            ASSERT_NEAR(got[size_t(i)], want, tol * std::max(1.0, std::abs(want)))
                << dtype_name(dt) << " " << reduce_op_name(op) << " at " << i << " on rank " << pg.rank();
          }
        }
      // Empty tensors are fine, and a large one crosses Gloo's segment boundaries.
      Tensor empty = zeros({0});
      pg.allreduce(empty)->wait();
      Tensor big = full({(1 << 20) + 3}, double(pg.rank() + 1));
      pg.allreduce(big)->wait();
      const auto v = big.to_vector<float>();
      EXPECT_EQ(v.front(), float(n * (n + 1) / 2));
      EXPECT_EQ(v.back(), float(n * (n + 1) / 2));
    });
  }
}

TEST(ProcessGroupGloo, MaxAndMinPropagateNaN) {
  run_ranks(2, [](ProcessGroupGloo& pg) {
    Tensor x = from_vector<float>({pg.rank() == 0 ? NAN : 1.0f, 2.0f});
    Tensor y = x.clone();
    pg.allreduce(x, ReduceOp::Max)->wait();
    pg.allreduce(y, ReduceOp::Min)->wait();
    EXPECT_TRUE(std::isnan(x.to_vector<float>()[0]));
    EXPECT_TRUE(std::isnan(y.to_vector<float>()[0]));
    EXPECT_EQ(x.to_vector<float>()[1], 2.0f);
  });
}

TEST(ProcessGroupGloo, BroadcastFromEveryRoot) {
  for (int n : {1, 2, 3}) {
    run_ranks(n, [n](ProcessGroupGloo& pg) {
      for (int root = 0; root < n; ++root)
        for (DType dt : kAllTypes) {
          Tensor x = rank_tensor(pg.rank(), 17, dt).view({1, 17});
          pg.broadcast(x, root)->wait();
          const auto got = x.to_vector<double>();
          for (int64_t i = 0; i < 17; ++i) ASSERT_EQ(got[size_t(i)], value(root, i)) << dtype_name(dt) << " root " << root;
        }
    });
  }
}

TEST(ProcessGroupGloo, AllgatherUnevenFirstDim) {
  for (int n = 1; n <= 4; ++n) {
    run_ranks(n, [n](ProcessGroupGloo& pg) {
      const int r = pg.rank();
      // Rank r sends r rows of 3 (rank 0 sends none), valued 100 * r + k.
      Tensor mine = arange(0, double(3 * r), 1.0, {DType::f64}).add_(full({3 * r}, 100.0 * r)).view({r, 3});
      const auto parts = pg.allgather(mine);
      ASSERT_EQ(int(parts.size()), n);
      for (int q = 0; q < n; ++q) {
        ASSERT_EQ(parts[size_t(q)].shape(), (Shape{q, 3}));
        const auto v = parts[size_t(q)].to_vector<double>();
        for (int k = 0; k < 3 * q; ++k) ASSERT_EQ(v[size_t(k)], 100.0 * q + k);
      }
      // Scalars gather to scalars; 16-bit types keep their bits.
      const auto scalars = pg.allgather(scalar_tensor(r + 0.5, {DType::bf16}));
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(scalars[size_t(q)].dim(), 0);
        EXPECT_EQ(scalars[size_t(q)].item<double>(), q + 0.5);
      }
    });
  }
}

TEST(ProcessGroupGloo, AllgatherMismatchIsAnErrorAndTheGroupSurvives) {
  run_ranks(2, [](ProcessGroupGloo& pg) {
    Tensor t = zeros({2, pg.rank() == 0 ? 3 : 4});
    EXPECT_EMBER_ERROR(pg.allgather(t), "allgather (world 2", "rank 0 [2, 3] float32", "rank 1 [2, 4] float32");
    EXPECT_EMBER_ERROR(pg.allgather(zeros({2}, {pg.rank() == 0 ? DType::f32 : DType::i32})), "dtypes must agree");
    Tensor x = ones({3});
    pg.allreduce(x)->wait();
    EXPECT_EQ(x.to_vector<float>()[2], 2.0f);
  });
}

TEST(ProcessGroupGloo, AllgatherBytes) {
  for (int n = 1; n <= 4; ++n) {
    run_ranks(n, [n](ProcessGroupGloo& pg) {
      const int r = pg.rank();
      Bytes mine(size_t(3 * r), uint8_t(r + 7));  // rank 0 sends nothing
      const auto all = pg.allgather_bytes(mine);
      ASSERT_EQ(int(all.size()), n);
      for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q)], Bytes(size_t(3 * q), uint8_t(q + 7)));
    });
  }
}

TEST(ProcessGroupGloo, ReduceScatter) {
  for (int n = 1; n <= 4; ++n) {
    run_ranks(n, [n](ProcessGroupGloo& pg) {
      const int r = pg.rank();
      for (DType dt : {DType::f32, DType::bf16, DType::i64})
        for (ReduceOp op : kAllOps) {
          if (op == ReduceOp::Avg && !is_floating(dt)) continue;
          const int64_t rows = 2, cols = 3, per = rows * cols;
          Tensor input = rank_tensor(r, n * per, dt).view({n * rows, cols});
          const Tensor before = input.clone();
          Tensor out = zeros({rows, cols}, {dt});
          pg.reduce_scatter(out, input, op)->wait();
          const auto got = out.to_vector<double>();
          const double tol = dt == DType::bf16 ? 1e-2 : 1e-6;
          for (int64_t k = 0; k < per; ++k) {
            const double want = expected(op, n, r * per + k);
            ASSERT_NEAR(got[size_t(k)], want, tol * std::max(1.0, std::abs(want)))
                << dtype_name(dt) << " " << reduce_op_name(op);
          }
          EXPECT_TRUE(testing::all_close(input, before, 0, 0)) << "reduce_scatter changed its input";
        }
      if (n > 1) EXPECT_EMBER_ERROR(pg.reduce_scatter(zeros({1, 3}), zeros({n + 1, 3})), "reduce_scatter", "equal chunks");
      EXPECT_EMBER_ERROR(pg.reduce_scatter(zeros({2, 3}), zeros({n, 3})), "output shape [2, 3]");
    });
  }
}

// What rank r contributes to allgather_into: 2-d, so the flat layout is what is checked.
Tensor gather_piece(int r, int64_t rows, DType dt) {
  std::vector<double> v(size_t(rows * 3));
  for (size_t k = 0; k < v.size(); ++k) v[k] = 10.0 * r + double(k);
  return from_vector(v, {rows, 3}).to(dt);
}

TEST(ProcessGroupGloo, AllgatherIntoMatchesAllgatherConcatenated) {
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE("world " + std::to_string(n));
    run_ranks(n, [n](ProcessGroupGloo& pg) {
      for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
        const Tensor mine = gather_piece(pg.rank(), 4, dt);
        Tensor out = full({n * 12}, -1.0, {dt});  // any shape with n * numel elements
        auto work = pg.allgather_into(out, mine);
        work->wait();
        EXPECT_TRUE(work->is_completed());
        const Tensor want = cat(pg.allgather(mine), 0).reshape({-1});
        EXPECT_TRUE(testing::all_close(out, want, 0, 0)) << dtype_name(dt);
        const auto got = out.to_vector<double>();
        for (int r = 0; r < n; ++r)
          for (int k = 0; k < 12; ++k) ASSERT_EQ(got[size_t(r * 12 + k)], 10.0 * r + k) << dtype_name(dt);
      }
      // In place: the input is this rank's chunk of the output, as in a sharded buffer.
      Tensor flat = zeros({n * 5}, {DType::f32});
      Tensor chunk = flat.narrow(0, pg.rank() * 5, 5);
      chunk.fill_(double(pg.rank() + 1));
      pg.allgather_into(flat, chunk)->wait();
      const auto v = flat.to_vector<float>();
      for (int r = 0; r < n; ++r) EXPECT_EQ(v[size_t(r * 5 + 4)], float(r + 1));
      // Empty inputs move nothing.
      Tensor empty_out = zeros({0});
      pg.allgather_into(empty_out, zeros({0, 3}))->wait();
      EXPECT_EQ(empty_out.numel(), 0);
    });
  }
}

TEST(ProcessGroupGloo, SeveralAllgatherIntoInFlightFinishInIssueOrder) {
  run_ranks(3, [](ProcessGroupGloo& pg) {
    const int n = pg.size(), r = pg.rank();
    std::vector<Tensor> outs, ins;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 4; ++i) {
      const int64_t len = (i == 1) ? (1 << 18) : 7 + i;  // one large enough to take a while
      ins.push_back(full({len}, 100.0 * i + r, {DType::f64}));
      outs.push_back(zeros({n * len}, {DType::f64}));
      works.push_back(pg.allgather_into(outs.back(), ins.back()));
      if (i == 2) {
        // Other collectives issued in between keep their place in the queue.
        Tensor x = full({3}, double(r + 1));
        works.push_back(pg.allreduce(x));
        works.back()->wait();
        EXPECT_EQ(x.to_vector<float>()[0], 6.0f);
        // Everything issued before the all-reduce has run by the time it finished.
        for (int k = 0; k <= 2; ++k) EXPECT_TRUE(works[size_t(k)]->is_completed()) << k;
      }
    }
    for (auto& w : works) w->wait();
    for (int i = 0; i < 4; ++i) {
      const auto got = outs[size_t(i)].to_vector<double>();
      const size_t len = size_t(ins[size_t(i)].numel());
      for (int q = 0; q < n; ++q) {
        ASSERT_EQ(got[size_t(q) * len], 100.0 * i + q) << "gather " << i;
        ASSERT_EQ(got[size_t(q) * len + len - 1], 100.0 * i + q) << "gather " << i;
      }
    }
  });
}

TEST(ProcessGroupGloo, AllgatherIntoRefusesBadBuffersAndMismatchedRanks) {
  run_ranks(2, [](ProcessGroupGloo& pg) {
    const std::string where = "allgather_into (world 2, rank " + std::to_string(pg.rank()) + ")";
    EXPECT_EMBER_ERROR(pg.allgather_into(zeros({5}), zeros({2, 3})), where, "output has 5 elements (shape [5])",
                       "world size 2", "6 elements (shape [2, 3])", "is 12");
    EXPECT_EMBER_ERROR(pg.allgather_into(zeros({12}, {DType::f64}), zeros({6})), where, "output dtype float64",
                       "input dtype float32");
    EXPECT_EMBER_ERROR(pg.allgather_into(zeros({4, 3}).t(), zeros({6})), where, "contiguous");
    // Ranks that disagree about the size fail alike, naming both, and the group goes on.
    const int64_t len = pg.rank() == 0 ? 3 : 4;
    EXPECT_EMBER_ERROR(pg.allgather_into(zeros({2 * len}), zeros({len}))->wait(), "allgather_into (world 2",
                       "rank 0 [3] float32", "rank 1 [4] float32");
    Tensor x = ones({2});
    pg.allreduce(x)->wait();
    EXPECT_EQ(x.to_vector<float>()[1], 2.0f);
  });
}

TEST(ProcessGroupGloo, BarrierWaitsForEveryone) {
  std::atomic<int> arrived{0};
  run_ranks(4, [&](ProcessGroupGloo& pg) {
    if (pg.rank() == 3) std::this_thread::sleep_for(milliseconds(50));
    arrived.fetch_add(1);
    pg.barrier();
    EXPECT_EQ(arrived.load(), 4);
  });
}

TEST(ProcessGroupGloo, AsyncWorksOverlapAndFinishInOrder) {
  run_ranks(2, [](ProcessGroupGloo& pg) {
    Tensor big = full({1 << 21}, double(pg.rank() + 1));
    Tensor small = full({5}, 10.0 * (pg.rank() + 1), {DType::f64});
    auto w1 = pg.allreduce(big);
    auto w2 = pg.allreduce(small, ReduceOp::Max);
    // The caller keeps computing while both are in flight.
    Tensor local = ones({256, 256}).matmul(ones({256, 256}));
    EXPECT_EQ(local.to_vector<float>()[0], 256.0f);
    w1->wait();
    EXPECT_TRUE(w1->is_completed());
    w2->wait();
    EXPECT_TRUE(w2->is_completed());
    EXPECT_EQ(big.to_vector<float>()[12345], 3.0f);
    EXPECT_EQ(small.to_vector<double>()[4], 20.0);
    w1->wait();  // waiting twice is fine
  });
}

TEST(ProcessGroupGloo, BadInputIsRefusedBeforeAnythingIsSent) {
  run_ranks(1, [](ProcessGroupGloo& pg) {
    Tensor t = zeros({4, 3}).transpose(0, 1);
    EXPECT_EMBER_ERROR(pg.allreduce(t), "allreduce (world 1, rank 0)", "contiguous", "[3, 4]");
    EXPECT_EMBER_ERROR(pg.allreduce(zeros({3}, {DType::boolean})), "dtype bool");
    EXPECT_EMBER_ERROR(pg.allreduce(zeros({3}, {DType::i32}), ReduceOp::Avg), "avg", "floating-point", "int32");
    EXPECT_EMBER_ERROR(pg.broadcast(zeros({3}), 1), "broadcast", "root 1 is out of range");
    EXPECT_EMBER_ERROR(pg.allreduce(Tensor()), "undefined");
    EXPECT_EMBER_ERROR(pg.allgather(zeros({2, 3}).t()), "allgather", "contiguous");
  });
}

TEST(ProcessGroupGloo, CudaTensorIsRefused) {
#if defined(EMBER_WITH_CUDA)
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  run_ranks(1, [](ProcessGroupGloo& pg) {
    EXPECT_EMBER_ERROR(pg.allreduce(zeros({3}, {DType::f32, Device::cuda(0)})), "gloo backend works on CPU tensors",
                       "cuda:0");
  });
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(ProcessGroupGloo, FingerprintsReportMismatchedAllreduceAndBroadcast) {
  run_ranks(2, [](ProcessGroupGloo& pg) {
    Tensor x = zeros({pg.rank() == 0 ? 4 : 5});
    EXPECT_EMBER_ERROR(pg.allreduce(x)->wait(), "allreduce (world 2", "allreduce #0 with different tensors",
                       "rank 0 [4] float32 sum", "rank 1 [5] float32 sum");
    EXPECT_EMBER_ERROR(pg.broadcast(ones({2}), pg.rank())->wait(), "broadcast #1", "rank 0 [2] float32 from root 0",
                       "rank 1 [2] float32 from root 1");
    EXPECT_EMBER_ERROR(pg.allreduce(ones({2}), pg.rank() == 0 ? ReduceOp::Sum : ReduceOp::Max)->wait(), "allreduce #2",
                       "float32 sum", "float32 max");
    Tensor y = ones({2});
    pg.allreduce(y)->wait();  // every rank failed alike, so the group goes on
    EXPECT_EQ(y.to_vector<float>()[0], 2.0f);
  });
}

TEST(ProcessGroupGloo, RanksInDifferentCollectivesFailAtOnceNamingEach) {
  // The classic hang: a collective on one rank only. Both ranks fail in far less than the
  // timeout, each naming what every rank was running, and the group stays usable.
  run_ranks(
      3,
      [](ProcessGroupGloo& pg) {
        const auto start = std::chrono::steady_clock::now();
        pg.barrier();  // #0 everywhere
        if (pg.rank() == 0) {
          EXPECT_EMBER_ERROR(pg.allgather(zeros({37, 2})), "allgather (world 3, rank 0)", "different collectives",
                             "rank 0 is in allgather #1 [37, 2] float32", "rank 1 in barrier #1",
                             "rank 2 in allreduce #1 [3] int64 max");
        } else if (pg.rank() == 1) {
          EXPECT_EMBER_ERROR(pg.barrier(), "barrier (world 3, rank 1)", "rank 0 is in allgather #1 [37, 2] float32");
        } else {
          EXPECT_EMBER_ERROR(pg.allreduce(zeros({3}, {DType::i64}), ReduceOp::Max)->wait(), "rank 1 in barrier #1");
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
        Bytes mine(size_t(pg.rank() + 1), uint8_t(pg.rank()));
        const auto all = pg.allgather_bytes(mine);  // #2: lengths travel in the fingerprints
        ASSERT_EQ(all.size(), 3u);
        EXPECT_EQ(all[2], Bytes(3, uint8_t(2)));
      },
      milliseconds(60000));
}

TEST(ProcessGroupGloo, FingerprintsOffStillCheckAllgatherShapes) {
  ProcessGroupOptions opt;
  opt.fingerprint_collectives = false;
  run_ranks(
      2,
      [](ProcessGroupGloo& pg) {
        Tensor x = ones({3});
        pg.allreduce(x)->wait();
        EXPECT_EQ(x.to_vector<float>()[2], 2.0f);
        pg.barrier();
        // allgather needs every rank's shape anyway, so it still compares them
        EXPECT_EMBER_ERROR(pg.allgather(zeros({2, pg.rank() == 0 ? 3 : 4})), "rank 0 [2, 3] float32", "rank 1 [2, 4] float32");
        EXPECT_EQ(pg.allgather(full({pg.rank() + 1}, 1.0))[1].size(0), 2);
      },
      milliseconds(10000), opt);
}

TEST(CollectiveFingerprint, EncodesRoundTripsAndDescribes) {
  CollectiveFingerprint f;
  f.kind = CollectiveKind::reduce_scatter;
  f.seq = 812;
  f.dtype = DType::bf16;
  f.shape = {37, 2};
  f.numel = 74;
  f.extra = int64_t(ReduceOp::Avg);
  const auto e = f.encode();
  ASSERT_EQ(e.size(), CollectiveFingerprint::kEncodedSize);
  const CollectiveFingerprint g = CollectiveFingerprint::decode(e.data());
  EXPECT_EQ(g.describe(), "reduce_scatter #812 [37, 2] bfloat16 avg");
  // 20 dims: the shape keeps 16, numel stays exact, and the fingerprints still compare equal
  CollectiveFingerprint deep;
  deep.kind = CollectiveKind::allreduce;
  deep.shape = Shape(20, 1);
  deep.numel = 1;
  EXPECT_EQ(CollectiveFingerprint::decode(deep.encode().data()).shape.size(), 16u);
  EXPECT_FALSE(fingerprint_mismatch("x", {deep, CollectiveFingerprint::decode(deep.encode().data())}));
  // payload bytes from a rank that skipped the exchange are named as such
  std::vector<int64_t> junk(CollectiveFingerprint::kEncodedSize, 7);
  const auto odd = fingerprint_mismatch("allreduce (world 2, rank 0)", {deep, CollectiveFingerprint::decode(junk.data())});
  ASSERT_TRUE(odd);
  EXPECT_NE(odd->find("rank 1 in no fingerprinted collective"), std::string::npos) << *odd;
}

TEST(CollectiveFingerprint, TheEnvironmentTurnsThemOff) {
  EXPECT_TRUE(collective_fingerprints_enabled_by_env());
  ::setenv("EMBER_COLLECTIVE_FINGERPRINT", "0", 1);
  EXPECT_FALSE(collective_fingerprints_enabled_by_env());
  ::setenv("EMBER_COLLECTIVE_FINGERPRINT", "on", 1);
  EXPECT_TRUE(collective_fingerprints_enabled_by_env());
  ::setenv("EMBER_COLLECTIVE_FINGERPRINT", "maybe", 1);
  EXPECT_EMBER_ERROR(collective_fingerprints_enabled_by_env(), "EMBER_COLLECTIVE_FINGERPRINT='maybe'");
  ::unsetenv("EMBER_COLLECTIVE_FINGERPRINT");
}

TEST(ProcessGroupGloo, MissingRankAtSetupIsNamed) {
  auto store = std::make_shared<HashStore>(milliseconds(1000));
  ProcessGroupOptions opt;
  opt.timeout = milliseconds(1000);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)  // rank 2 of 3 never comes
    threads.emplace_back([&, r] {
      EXPECT_EMBER_ERROR(ProcessGroupGloo(store, r, 3, opt), "ProcessGroupGloo setup (world 3", "rank 2 did not join",
                         "within 1s", "2 of 3");
    });
  for (auto& t : threads) t.join();
}

TEST(ProcessGroupGloo, StuckRankTimesOutAndBreaksTheGroup) {
  run_ranks(
      2,
      [](ProcessGroupGloo& pg) {
        Tensor x = ones({8});
        if (pg.rank() == 0) {
          EXPECT_EMBER_ERROR(pg.allreduce(x)->wait(), "allreduce (world 2, rank 0)", "rank 1 did not respond within 1s");
          EXPECT_EMBER_ERROR(pg.allreduce(x)->wait(), "unusable after an earlier failure");
        } else {
          std::this_thread::sleep_for(milliseconds(1500));  // never joins the allreduce
        }
      },
      milliseconds(1000));
}

TEST(ProcessGroupGloo, FactoryAndGroupsSharingAStore) {
  auto store = std::make_shared<HashStore>(milliseconds(10000));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        ProcessGroupOptions opt;
        opt.timeout = milliseconds(10000);
        auto a = new_process_group(store, r, 2, "gloo", opt);
        auto b = new_process_group(store, r, 2, "gloo", opt);  // own key space, same store
        Tensor x = ones({3});
        a->allreduce(x)->wait();
        b->allreduce(x)->wait();
        EXPECT_EQ(x.to_vector<float>()[0], 4.0f);
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EMBER_ERROR(new_process_group(store, 0, 1, "mpi"), "unknown backend 'mpi'");
#if !defined(EMBER_WITH_NCCL)
  EXPECT_EMBER_ERROR(new_process_group(store, 0, 1, "nccl"), "nccl");
#endif
}

// ---- real processes

struct Child {
  pid_t pid = -1;
  std::string log;
  int status = -1;  // exit code once reaped; -2 when killed at the deadline
};

// Starts pg_worker ranks with their output in files, reaps them by a deadline and kills any
// that are left (a test never hangs on a child).
class Workers {
 public:
  explicit Workers(int port) : port_(port), dir_("ember_pg_test") {}
  ~Workers() {
    for (auto& c : children_)
      if (c.pid > 0 && c.status == -1) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
      }
  }

  void start(int rank, int size, const std::string& scenario, int timeout_ms, int victim = -1) {
    Child c;
    c.log = dir_.file("rank" + std::to_string(rank) + ".log");
    std::vector<std::string> args = {std::string(EMBER_TEST_PROGRAMS) + "/pg_worker",
                                     "--port", std::to_string(port_),
                                     "--rank", std::to_string(rank),
                                     "--size", std::to_string(size),
                                     "--scenario", scenario,
                                     "--timeout-ms", std::to_string(timeout_ms),
                                     "--victim", std::to_string(victim)};
    c.pid = testing::spawn_logged(args, c.log);
    children_.push_back(c);
  }

  // Reaps the listed ranks (all when empty) until `deadline_ms`; the rest are killed.
  void finish(int deadline_ms, std::vector<int> ranks = {}) {
    if (ranks.empty())
      for (int i = 0; i < int(children_.size()); ++i) ranks.push_back(i);
    const auto end = std::chrono::steady_clock::now() + milliseconds(deadline_ms);
    for (int i : ranks) {
      Child& c = children_[size_t(i)];
      while (c.status == -1) {
        int st = 0;
        const pid_t got = ::waitpid(c.pid, &st, WNOHANG);
        if (got == c.pid) {
          c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        } else if (std::chrono::steady_clock::now() > end) {
          ::kill(c.pid, SIGKILL);
          ::waitpid(c.pid, nullptr, 0);
          c.status = -2;
        } else {
          std::this_thread::sleep_for(milliseconds(10));
        }
      }
    }
  }

  const Child& child(int rank) const { return children_[size_t(rank)]; }
  std::string output(int rank) const { return testing::read_text_file(children_[size_t(rank)].log); }

 private:
  int port_;
  testing::TempDir dir_;
  std::vector<Child> children_;
};

std::shared_ptr<TcpStore> serve_store() { return std::make_shared<TcpStore>("127.0.0.1", 0, true, milliseconds(30000)); }

TEST(ProcessGroupGlooProcesses, CollectivesAcrossProcesses) {
  for (int n : {2, 4}) {
    auto store = serve_store();
    Workers w(store->port());
    for (int r = 0; r < n; ++r) w.start(r, n, "check", 10000);
    w.finish(30000);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(w.child(r).status, 0) << "world " << n << " rank " << r << ":\n" << w.output(r);
      EXPECT_NE(w.output(r).find("OK"), std::string::npos) << w.output(r);
    }
  }
}

TEST(ProcessGroupGlooProcesses, KilledRankFailsTheAllreduceOnTheSurvivor) {
  auto store = serve_store();
  Workers w(store->port());
  for (int r = 0; r < 2; ++r) w.start(r, 2, "kill_before_allreduce", 3000, 1);
  w.finish(20000);
  EXPECT_EQ(w.child(1).status, 128 + SIGKILL);
  EXPECT_EQ(w.child(0).status, 3) << w.output(0);
  const std::string out = w.output(0);
  for (const char* frag : {"ERROR: allreduce (world 2, rank 0)", "rank 1"})
    EXPECT_NE(out.find(frag), std::string::npos) << out;
}

TEST(ProcessGroupGlooProcesses, ExitedRankFailsTheAllreduceOnEverySurvivor) {
  auto store = serve_store();
  Workers w(store->port());
  for (int r = 0; r < 3; ++r) w.start(r, 3, "die_before_allreduce", 3000, 2);
  w.finish(20000);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(w.child(r).status, 3) << w.output(r);
    EXPECT_NE(w.output(r).find("ERROR: allreduce (world 3, rank " + std::to_string(r) + ")"), std::string::npos)
        << w.output(r);
    // The dead rank is named, alone ("rank 2") or with a survivor that was slow to report
    // ("ranks 0, 2") on a loaded machine.
    EXPECT_TRUE(std::regex_search(w.output(r), std::regex("ranks? ([0-9]+, )*2\\b"))) << w.output(r);
  }
}

TEST(ProcessGroupGlooProcesses, KilledRankFailsAllgatherIntoOnEverySurvivorWithinTheTimeout) {
  auto store = serve_store();
  Workers w(store->port());
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 3; ++r) w.start(r, 3, "kill_before_allgather_into", 3000, 1);
  w.finish(20000);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(w.child(1).status, 128 + SIGKILL);
  for (int r : {0, 2}) {
    EXPECT_EQ(w.child(r).status, 3) << w.output(r);
    EXPECT_NE(w.output(r).find("ERROR: allgather_into (world 3, rank " + std::to_string(r) + ")"), std::string::npos)
        << w.output(r);
    EXPECT_TRUE(std::regex_search(w.output(r), std::regex("ranks? ([0-9]+, )*1\\b"))) << w.output(r);
  }
  EXPECT_LT(took, 3.0 + 7.0);  // the timeout plus start-up on a loaded machine
}

TEST(ProcessGroupGlooProcesses, StuckRankTimesOut) {
  auto store = serve_store();
  Workers w(store->port());
  for (int r = 0; r < 2; ++r) w.start(r, 2, "hang_before_allreduce", 2000, 1);
  w.finish(20000, {0});
  EXPECT_EQ(w.child(0).status, 3) << w.output(0);
  EXPECT_NE(w.output(0).find("allreduce (world 2, rank 0): rank 1 did not respond within 2s"), std::string::npos)
      << w.output(0);
}  // the stuck rank is killed here

TEST(ProcessGroupGlooProcesses, RankThatNeverArrivesFailsSetup) {
  auto store = serve_store();
  Workers w(store->port());
  w.start(0, 2, "check", 1500);
  w.finish(20000);
  EXPECT_EQ(w.child(0).status, 3) << w.output(0);
  EXPECT_NE(w.output(0).find("ProcessGroupGloo setup (world 2, rank 0): rank 1 did not join within 1.5s"),
            std::string::npos)
      << w.output(0);
}

}  // namespace
}  // namespace ember::distributed
