// Shapes whose element count, byte count, strides or storage extent do not fit in int64_t are
// refused, naming the op and the shape, by every factory and view op: none may make a tensor
// from a wrapped-around size (empty({2^62 + 1, 4}) once had 4 elements).
#include <cstdint>
#include <limits>

#include "core/native/views.h"
#include "test_util.h"

using namespace ember;

namespace {
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k2p31 = int64_t(1) << 31, k2p33 = int64_t(1) << 33, k2p40 = int64_t(1) << 40,
                  k2p62 = int64_t(1) << 62;
}  // namespace

TEST(ShapeOverflow, NumelOfChecksEveryProduct) {
  EXPECT_EQ(numel_of({}), 1);
  EXPECT_EQ(numel_of({3, 5}), 15);
  EXPECT_EQ(numel_of({kMax}), kMax);
  EXPECT_EQ(numel_of({k2p40, k2p40, 0}), 0);  // a zero size: the count fits, whatever the rest
  EXPECT_EMBER_ERROR(numel_of({k2p31, k2p33}), "numel: shape [2147483648, 8589934592] has more than 2^63 - 1 elements");
  EXPECT_EMBER_ERROR(numel_of({k2p62 + 1, 4}, "myop"), "myop: shape [4611686018427387905, 4] has more than");
  EXPECT_EMBER_ERROR(numel_of({2, -3}, "myop"), "myop: negative size -3 in shape [2, -3]");
}

TEST(ShapeOverflow, NbytesAndStridesMustFit) {
  EXPECT_EQ(nbytes_of({3, 5}, 4, "t"), 60u);
  // 2^62 elements fit, their 2^64 bytes do not.
  EXPECT_EMBER_ERROR(nbytes_of({k2p62}, 4, "t"), "t: shape [4611686018427387904] of 4-byte elements needs more than 2^63 - 1 bytes");
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({k2p40, k2p40, 0}), (Shape{k2p40, 1, 1}));
  EXPECT_EMBER_ERROR(contiguous_strides({0, k2p40, k2p40}, "t"), "t: shape [0, 1099511627776, 1099511627776] has a stride past 2^63 - 1");
}

TEST(ShapeOverflow, StorageExtentCoversEveryStridedView) {
  EXPECT_EQ(storage_extent({2, 3}, {3, 1}, 0, "t"), 6);
  EXPECT_EQ(storage_extent({2, 3}, {1, 2}, 5, "t"), 11);
  EXPECT_EQ(storage_extent({4, 3}, {0, 1}, 0, "t"), 3);  // broadcast
  EXPECT_EQ(storage_extent({0, 3}, {kMax, kMax}, 7, "t"), 0);
  EXPECT_EQ(storage_extent({3}, {-2}, 4, "t"), 5);  // elements 4, 2, 0
  EXPECT_EMBER_ERROR(storage_extent({3}, {-2}, 3, "t"), "t: a view of shape [3] with strides [-2] at offset 3 reaches element -1");
  EXPECT_EMBER_ERROR(storage_extent({3, 2}, {kMax / 2, 1}, 0, "t"), "t: a view of shape [3, 2]", "reaches past element 2^63 - 1");
}

TEST(ShapeOverflow, FactoriesNameThemselvesAndTheShape) {
  EXPECT_EMBER_ERROR(zeros({k2p31, k2p33}), "zeros: shape [2147483648, 8589934592] has more than 2^63 - 1 elements");
  EXPECT_EMBER_ERROR(empty({k2p62 + 1, 4}), "empty: shape [4611686018427387905, 4] has more than 2^63 - 1 elements");
  EXPECT_EMBER_ERROR(ones({k2p40, k2p40}), "ones: shape [1099511627776, 1099511627776] has more than");
  EXPECT_EMBER_ERROR(full({k2p40, k2p40}, 2.0), "full: shape [1099511627776, 1099511627776] has more than");
  EXPECT_EMBER_ERROR(randn({k2p33, k2p31}), "randn: shape [8589934592, 2147483648] has more than");
  EXPECT_EMBER_ERROR(rand({k2p33, k2p31}), "rand: shape [8589934592, 2147483648] has more than");
  EXPECT_EMBER_ERROR(randint(0, 5, {k2p33, k2p31}), "randint: shape [8589934592, 2147483648] has more than");
  EXPECT_EMBER_ERROR(empty({k2p62}, {DType::f64}), "empty: shape [4611686018427387904] of 8-byte elements needs more than");
  EXPECT_EMBER_ERROR(zeros({0, k2p40, k2p40}), "zeros: shape [0, 1099511627776, 1099511627776] has a stride past");
  EXPECT_EMBER_ERROR(arange(0.0, 1e300), "arange: [0, 1e+300) in steps of 1 has more than 2^63 - 1 elements");
  float x = 0;
  EXPECT_EMBER_ERROR(from_blob(&x, {k2p62 + 1, 4}, DType::f32), "from_blob: shape [4611686018427387905, 4] has more than");
  EXPECT_EMBER_ERROR(from_buffer(&x, {k2p62 + 1, 4}, DType::f32), "from_buffer: shape [4611686018427387905, 4] has more than");
  EXPECT_EMBER_ERROR(from_vector<float>({1, 2, 3, 4}, {k2p62 + 1, 4}), "from_vector: shape [4611686018427387905, 4] has more than");
  // A zero-sized shape whose other sizes are huge is fine while its strides fit.
  Tensor e = zeros({k2p40, k2p40, 0});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.strides(), (Shape{k2p40, 1, 1}));
}

TEST(ShapeOverflow, NegativeSizesAreRefused) {
  EXPECT_EMBER_ERROR(zeros({2, -3}), "zeros: negative size -3 in shape [2, -3]");
  EXPECT_EMBER_ERROR(empty({-1}), "empty: negative size -1 in shape [-1]");
  EXPECT_EMBER_ERROR(randn({4, -2}), "randn: negative size -2 in shape [4, -2]");
  EXPECT_EMBER_ERROR(zeros({1, 3}).expand({-2, 3}), "expand: invalid size -2 in [-2, 3]");
  EXPECT_EMBER_ERROR(zeros({1, 3}).expand({-2, -1}), "expand: invalid size -2 in [-2, -1]");
  EXPECT_EMBER_ERROR(zeros({4}).view({-2, -2}), "view: invalid size -2 in shape [-2, -2]");
}

TEST(ShapeOverflow, ViewAndReshapeRefuseWrappedShapes) {
  Tensor x = zeros({4});
  // [2^62 + 1, 4] wraps to 4 elements: it once passed as a view of these 4.
  EXPECT_EMBER_ERROR(x.view({k2p62 + 1, 4}), "view: shape [4611686018427387905, 4] has more than 2^63 - 1 elements");
  EXPECT_EMBER_ERROR(x.reshape({k2p62 + 1, 4}), "reshape: shape [4611686018427387905, 4] has more than 2^63 - 1 elements");
  EXPECT_EMBER_ERROR(x.view({-1, k2p62, 4}), "view: shape [-1, 4611686018427387904, 4] has more than");
  EXPECT_EMBER_ERROR(x.reshape({k2p33, -1, k2p31}), "reshape: shape [8589934592, -1, 2147483648] has more than");
  EXPECT_EQ(x.view({2, -1}).shape(), (Shape{2, 2}));
  EXPECT_EQ(zeros({0}).reshape({k2p40, 0, k2p40}).numel(), 0);
}

TEST(ShapeOverflow, ExpandRefusesCountsPastInt64) {
  Tensor one = zeros({1, 1});
  EXPECT_EMBER_ERROR(one.expand({k2p40, k2p40}), "expand: shape [1099511627776, 1099511627776] has more than 2^63 - 1 elements");
  EXPECT_EMBER_ERROR(one.expand({k2p31, k2p33, 1}), "expand: shape [2147483648, 8589934592, 1] has more than");
  // A large expand that fits is a view: no memory.
  Tensor wide = one.expand({k2p40, 4});
  EXPECT_EQ(wide.numel(), k2p40 * 4);
  EXPECT_EQ(wide.strides(), (Shape{0, 0}));
}

TEST(ShapeOverflow, BroadcastOfTwoBigShapesIsRefused) {
  EXPECT_EMBER_ERROR(broadcast_shapes({k2p40, 1}, {1, k2p40}, "myop"),
                     "myop: shapes [1099511627776, 1] and [1, 1099511627776] broadcast to [1099511627776, 1099511627776], "
                     "which has more than 2^63 - 1 elements");
  const Tensor a = zeros({1, 1}).expand({k2p40, 1}), b = zeros({1, 1}).expand({1, k2p40});
  EXPECT_EMBER_ERROR(a + b, "add: shapes [1099511627776, 1] and [1, 1099511627776] broadcast to", "more than 2^63 - 1 elements");
  EXPECT_EMBER_ERROR(a * b, "mul: shapes [1099511627776, 1] and [1, 1099511627776] broadcast to", "more than 2^63 - 1 elements");
  EXPECT_EQ(broadcast_shapes({k2p40, 1}, {1, 4}, "myop"), (Shape{k2p40, 4}));
}

TEST(ShapeOverflow, SliceWithAHugeStepStaysInItsStorage) {
  Tensor x = arange(40, {DType::f32}).view({10, 4});
  // The step overflows stride 4, but one row never advances, so the view is row 0.
  Tensor s = x.slice(0, 0, 10, k2p62);
  EXPECT_EQ(s.shape(), (Shape{1, 4}));
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  Tensor t = x.slice(1, 1, 4, kMax);  // (end - start + step - 1) once overflowed here
  EXPECT_EQ(t.shape(), (Shape{10, 1}));
  EXPECT_EQ(t.contiguous().to_vector<float>()[9], 37.0f);
}

TEST(ShapeOverflow, ViewsCannotReachPastTheirStorage) {
  Tensor x = zeros({3, 4});
  EXPECT_EMBER_ERROR(make_view(x, {3, 5}, {4, 1}, 0), "view: a view of shape [3, 5] with strides [4, 1] at offset 0 needs 13 elements but its storage holds 12");
  EXPECT_EMBER_ERROR(make_view(x, {2}, {1}, -1), "view: a view of shape [2] with strides [1] at offset -1 reaches element -1");
  EXPECT_EMBER_ERROR(make_view(x, {2, 2}, {kMax, 1}, 0), "reaches past element 2^63 - 1");
  EXPECT_EQ(make_view(x, {2, 2}, {1, 4}, 6).numel(), 4);  // reaches element 11, the last
  EXPECT_EQ(make_view(x, {0, 2}, {kMax, kMax}, 100).numel(), 0);
}
