// cat, stack, split, chunk, index_select, gather, scatter_add and one_hot: forward against the
// reference on random shapes and dtypes, backward through gradcheck, and error messages.
#include <algorithm>

#include "kernels/reference/indexing.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::expect_gradcheck;
using ember::testing::kFloatTypes;
using ember::testing::random_index;
using ember::testing::random_shape;
using ember::testing::random_tensor;
using ember::testing::uniform_int;
using ember::testing::with_one_and_two_threads;
namespace ref = ember::reference;

namespace {

const std::vector<DType> kAllTypes = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64};

template <typename T> const T& pick(const std::vector<T>& v) { return v[size_t(uniform_int(0, int64_t(v.size()) - 1))]; }

// Gradient checks in f64 on small random inputs.
Tensor grad_input(const Shape& shape) { return random_tensor(shape, DType::f64).requires_grad_(); }

}  // namespace

// ---------------------------------------------------------------- forward

TEST(Cat, MatchesReferenceOnRandomShapes) {
  for (int trial = 0; trial < 60; ++trial) {
    const int nd = int(uniform_int(1, 4));
    const Shape base = random_shape(nd, 4, true);
    const int64_t dim = uniform_int(-nd, nd - 1);
    const DType dtype = pick(kAllTypes);
    const int count = int(uniform_int(1, 4));
    std::vector<Tensor> xs;
    std::vector<ref::RefTensor> rs;
    for (int k = 0; k < count; ++k) {
      Shape s = base;
      s[size_t(dim < 0 ? dim + nd : dim)] = uniform_int(0, 4);
      xs.push_back(random_tensor(s, dtype, coin()));
      rs.push_back(ref::from_tensor(xs.back()));
    }
    SCOPED_TRACE(::testing::Message() << "base " << shape_str(base) << " dim " << dim << " " << dtype_name(dtype));
    Tensor out = cat(xs, dim);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_TRUE(all_close(out, ref::cat(rs, dim), 0, 0));
  }
}

TEST(Cat, PromotesDtypesAndSkipsLegacyEmpty) {
  Tensor a = from_vector<int32_t>({1, 2}, {1, 2});
  Tensor b = from_vector<float>({0.5f, 1.5f}, {1, 2});
  Tensor out = cat({a, b}, 0);
  EXPECT_EQ(out.dtype(), DType::f32);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1, 2, 0.5f, 1.5f}));
  // 1-D empty tensors are ignored whatever the other shapes (PyTorch's rule)
  Tensor acc = cat({zeros({0}), a.to(DType::f32)}, 1);
  EXPECT_EQ(acc.shape(), (Shape{1, 2}));
  EXPECT_EQ(cat({zeros({0}), zeros({0})}, 0).shape(), (Shape{0}));
}

TEST(Cat, LargeInputsUseAllThreadsConsistently) {
  Tensor a = random_tensor({64, 300}), b = random_tensor({64, 17}, DType::f32, true);
  auto [one, two] = with_one_and_two_threads([&] { return cat({a, b, a}, 1); });
  EXPECT_TRUE(all_close(one, ref::cat({ref::from_tensor(a), ref::from_tensor(b), ref::from_tensor(a)}, 1), 0, 0));
  EXPECT_TRUE(all_close(two, one, 0, 0));
}

TEST(Stack, MatchesReferenceOnRandomShapes) {
  for (int trial = 0; trial < 40; ++trial) {
    const int nd = int(uniform_int(0, 3));
    const Shape shape = random_shape(nd, 4, true);
    const int64_t dim = uniform_int(-(nd + 1), nd);
    const DType dtype = pick(kAllTypes);
    std::vector<Tensor> xs;
    std::vector<ref::RefTensor> rs;
    for (int k = 0; k < int(uniform_int(1, 4)); ++k) {
      xs.push_back(random_tensor(shape, dtype, coin()));
      rs.push_back(ref::from_tensor(xs.back()));
    }
    SCOPED_TRACE(::testing::Message() << "shape " << shape_str(shape) << " dim " << dim);
    EXPECT_TRUE(all_close(stack(xs, dim), ref::stack(rs, dim), 0, 0));
  }
  Tensor scalars = stack({scalar_tensor(1.0), scalar_tensor(2.0)}, -1);
  EXPECT_EQ(scalars.shape(), (Shape{2}));
  EXPECT_EQ(scalars.to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(Split, PiecesMatchReferenceAndAreViews) {
  for (int trial = 0; trial < 40; ++trial) {
    const int nd = int(uniform_int(1, 3));
    const Shape shape = random_shape(nd, 7, true);
    const int64_t dim = uniform_int(-nd, nd - 1);
    const int64_t n = shape[size_t(dim < 0 ? dim + nd : dim)];
    Tensor x = random_tensor(shape, pick(kAllTypes), coin());
    const int64_t split_size = n == 0 ? 0 : uniform_int(1, n + 1);
    std::vector<Tensor> pieces = split(x, split_size, dim);
    std::vector<int64_t> sizes;
    for (const Tensor& p : pieces) {
      sizes.push_back(p.size(dim));
      EXPECT_EQ(p.impl()->storage, x.impl()->storage) << "split must return views";
    }
    for (size_t i = 0; i + 1 < sizes.size(); ++i) EXPECT_EQ(sizes[i], split_size);
    const auto expected = ref::split(ref::from_tensor(x), sizes, dim);
    ASSERT_EQ(pieces.size(), expected.size());
    for (size_t i = 0; i < pieces.size(); ++i) EXPECT_TRUE(all_close(pieces[i], expected[i], 0, 0));
    // explicit sizes
    std::vector<int64_t> custom;
    for (int64_t left = n; left > 0;) {
      custom.push_back(uniform_int(0, left));
      left -= custom.back();
    }
    custom.push_back(0);
    const auto explicit_pieces = split(x, custom, dim);
    const auto explicit_expected = ref::split(ref::from_tensor(x), custom, dim);
    ASSERT_EQ(explicit_pieces.size(), custom.size());
    for (size_t i = 0; i < custom.size(); ++i) EXPECT_TRUE(all_close(explicit_pieces[i], explicit_expected[i], 0, 0));
  }
}

TEST(Chunk, FollowsPyTorchSizes) {
  auto sizes_of = [](const std::vector<Tensor>& pieces) {
    std::vector<int64_t> s;
    for (const Tensor& p : pieces) s.push_back(p.size(0));
    return s;
  };
  Tensor x = arange(5, {DType::f32});
  EXPECT_EQ(sizes_of(chunk(x, 4)), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(sizes_of(chunk(arange(6), 4)), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes_of(chunk(arange(6), 3)), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes_of(chunk(arange(3), 5)), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(sizes_of(chunk(arange(0), 3)), (std::vector<int64_t>{0, 0, 0}));
  Tensor m = random_tensor({3, 7}, DType::f64, true);
  auto pieces = chunk(m, 3, -1);
  ASSERT_EQ(pieces.size(), 3u);
  const auto expected = ref::split(ref::from_tensor(m), {3, 3, 1}, 1);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(all_close(pieces[i], expected[i], 0, 0));
  EXPECT_EQ(pieces[2].storage_offset(), m.storage_offset() + 6 * m.stride(1));
}

TEST(IndexSelect, MatchesReferenceOnRandomShapes) {
  for (int trial = 0; trial < 60; ++trial) {
    const int nd = int(uniform_int(1, 4));
    const Shape shape = random_shape(nd, 5, true);
    const int64_t dim = uniform_int(-nd, nd - 1);
    const int64_t n = shape[size_t(dim < 0 ? dim + nd : dim)];
    const DType dtype = pick(kAllTypes);
    Tensor x = random_tensor(shape, dtype, coin());
    Tensor index = random_index({n == 0 ? 0 : uniform_int(0, 7)}, n, coin() ? DType::i32 : DType::i64, coin());
    SCOPED_TRACE(::testing::Message() << "shape " << shape_str(shape) << " dim " << dim << " " << dtype_name(dtype));
    EXPECT_TRUE(all_close(index_select(x, dim, index), ref::index_select(ref::from_tensor(x), dim, ref::from_tensor(index)), 0, 0));
  }
  // a 0-d index selects one slice and keeps the dim
  Tensor x = random_tensor({3, 4});
  Tensor one = index_select(x, 1, scalar_tensor(2, {DType::i64}));
  EXPECT_EQ(one.shape(), (Shape{3, 1}));
  EXPECT_TRUE(all_close(one, x.slice(1, 2, 3), 0, 0));
}

TEST(IndexSelect, LongRowsAndManyRowsAgreeAcrossThreads) {
  Tensor w = random_tensor({50, 600});
  Tensor index = random_index({300}, 50);
  auto [one, two] = with_one_and_two_threads([&] { return index_select(w, 0, index); });
  EXPECT_TRUE(all_close(one, ref::index_select(ref::from_tensor(w), 0, ref::from_tensor(index)), 0, 0));
  EXPECT_TRUE(all_close(two, one, 0, 0));
}

TEST(Gather, MatchesReferenceOnRandomShapes) {
  for (int trial = 0; trial < 60; ++trial) {
    const int nd = int(uniform_int(1, 4));
    const Shape shape = random_shape(nd, 5);
    const int64_t dim = uniform_int(-nd, nd - 1);
    const size_t d = size_t(dim < 0 ? dim + nd : dim);
    Shape ishape = shape;
    for (size_t k = 0; k < ishape.size(); ++k) ishape[k] = k == d ? uniform_int(0, 6) : uniform_int(0, shape[k]);
    const DType dtype = pick(kAllTypes);
    Tensor x = random_tensor(shape, dtype, coin());
    Tensor index = random_index(ishape, shape[d], coin() ? DType::i32 : DType::i64, coin());
    SCOPED_TRACE(::testing::Message() << "shape " << shape_str(shape) << " index " << shape_str(ishape) << " dim " << dim);
    EXPECT_TRUE(all_close(gather(x, dim, index), ref::gather(ref::from_tensor(x), dim, ref::from_tensor(index)), 0, 0));
  }
  // 0-d input and index
  EXPECT_EQ(gather(scalar_tensor(3.0), 0, scalar_tensor(0, {DType::i64})).item<double>(), 3.0);
}

TEST(ScatterAdd, MatchesReferenceOnRandomShapes) {
  for (int trial = 0; trial < 60; ++trial) {
    const int nd = int(uniform_int(1, 4));
    const Shape shape = random_shape(nd, 5);
    const int64_t dim = uniform_int(-nd, nd - 1);
    const size_t d = size_t(dim < 0 ? dim + nd : dim);
    Shape ishape = shape, sshape = shape;
    for (size_t k = 0; k < ishape.size(); ++k) {
      ishape[k] = k == d ? uniform_int(0, 6) : uniform_int(0, shape[k]);
      sshape[k] = ishape[k] + uniform_int(0, 2);
    }
    const DType dtype = pick(kAllTypes);
    Tensor x = random_tensor(shape, dtype, coin());
    Tensor src = random_tensor(sshape, dtype, coin());
    Tensor index = random_index(ishape, shape[d], coin() ? DType::i32 : DType::i64, coin());
    SCOPED_TRACE(::testing::Message() << "shape " << shape_str(shape) << " index " << shape_str(ishape) << " src "
                                      << shape_str(sshape) << " dim " << dim << " " << dtype_name(dtype));
    const auto expected = ref::scatter_add(ref::from_tensor(x), dim, ref::from_tensor(index), ref::from_tensor(src));
    // Each element adds at most 6 terms of |v| < 2 to x, rounding once per add in the storage
    // type: the error is bounded by a few ulps of the largest partial sum (< 16).
    const double tol = ember::testing::tolerance(dtype);
    EXPECT_TRUE(all_close(scatter_add(x, dim, index, src), expected, tol, 32 * tol));
  }
}

TEST(ScatterAdd, IsDeterministicAcrossThreadCounts) {
  // Many collisions on few rows: the sum order must not depend on the thread split.
  Tensor x = random_tensor({8, 2000});
  Tensor src = random_tensor({400, 2000});
  Tensor index = random_index({400, 2000}, 8);
  auto [one, two] = with_one_and_two_threads([&] { return scatter_add(x, 0, index, src); });
  EXPECT_EQ(one.to_vector<float>(), two.to_vector<float>());
  EXPECT_TRUE(all_close(one, ref::scatter_add(ref::from_tensor(x), 0, ref::from_tensor(index), ref::from_tensor(src)), 1e-4, 1e-4));
}

TEST(OneHot, MatchesReference) {
  Tensor idx = from_vector<int64_t>({2, 0, 4, 4}, {2, 2});
  Tensor inferred = one_hot(idx);
  EXPECT_EQ(inferred.dtype(), DType::i64);
  EXPECT_EQ(inferred.shape(), (Shape{2, 2, 5}));
  EXPECT_TRUE(all_close(inferred, ref::one_hot(ref::from_tensor(idx), 5), 0, 0));
  Tensor wide = one_hot(idx.to(DType::i32), 7);
  EXPECT_TRUE(all_close(wide, ref::one_hot(ref::from_tensor(idx), 7), 0, 0));
  EXPECT_EQ(one_hot(zeros({0}, {DType::i64}), 3).shape(), (Shape{0, 3}));
}

// ---------------------------------------------------------------- backward

TEST(IndexingGrad, CatStackGradcheck) {
  for (int trial = 0; trial < 3; ++trial) {
    const Shape s = random_shape(2, 3);
    Tensor a = grad_input(s), b = grad_input({s[0], uniform_int(1, 3)}), c = random_tensor(s, DType::f64);
    expect_gradcheck([](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {cat({in[0], in[1], in[2]}, -1)}; },
                     {a, b, c});
    Tensor d = grad_input(s);
    expect_gradcheck([](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {stack({in[0], in[1], in[2]}, 1)}; },
                     {a, d, c});
  }
}

TEST(IndexingGrad, CatGradientKeepsEachInputsDtype) {
  Tensor a = random_tensor({2, 3}, DType::f32).requires_grad_();
  Tensor b = random_tensor({1, 3}, DType::f64).requires_grad_();
  Tensor out = cat({a, b}, 0);
  EXPECT_EQ(out.dtype(), DType::f64);
  out.backward(from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3}));
  EXPECT_EQ(a.grad().dtype(), DType::f32);
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{7, 8, 9}));
}

TEST(IndexingGrad, SplitChunkGradcheck) {
  Tensor x = grad_input({5, 3});
  expect_gradcheck([](const std::vector<Tensor>& in) { return split(in[0], 2, 0); }, {x});
  expect_gradcheck([](const std::vector<Tensor>& in) { return split(in[0], std::vector<int64_t>{1, 0, 2}, -1); }, {x});
  expect_gradcheck([](const std::vector<Tensor>& in) { return chunk(in[0], 2, 1); }, {x});
}

TEST(IndexingGrad, SplitPieceGradientLandsInItsSlice) {
  Tensor x = zeros({4, 2}, {DType::f32, Device::cpu(), true});
  auto pieces = split(x, 3, 0);
  ASSERT_EQ(pieces.size(), 2u);
  ASSERT_TRUE(pieces[1].grad_fn() != nullptr);
  pieces[1].backward(full({1, 2}, 5.0));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 0, 0, 5, 5}));
}

TEST(IndexingGrad, IndexSelectGatherScatterAddGradcheck) {
  for (int trial = 0; trial < 3; ++trial) {
    const Shape s = random_shape(3, 3);
    const int64_t dim = uniform_int(-3, 2);
    const size_t d = size_t(dim < 0 ? dim + 3 : dim);
    Tensor x = grad_input(s);
    Tensor sel = random_index({4}, s[d]);  // 4 picks from at most 3: repeats guaranteed
    expect_gradcheck([&](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {index_select(in[0], dim, sel)}; }, {x});
    Shape ishape = s;
    ishape[d] = 4;
    Tensor idx = random_index(ishape, s[d]);
    expect_gradcheck([&](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {gather(in[0], dim, idx)}; }, {x});
    Shape sshape = ishape;
    sshape[(d + 1) % 3] += 1;  // source larger than the index: its extra part gets no gradient
    Tensor src = grad_input(sshape);
    expect_gradcheck([&](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {scatter_add(in[0], dim, idx, in[1])}; },
                     {x, src});
  }
}

TEST(IndexingGrad, IndexSelectBackwardMatchesIndexAddReference) {
  Tensor x = random_tensor({6, 9}, DType::f32).requires_grad_();
  Tensor index = random_index({20}, 9, DType::i32);
  Tensor g = random_tensor({6, 20});
  index_select(x, 1, index).backward(g);
  const auto expected = ref::index_add(ref::RefTensor({6, 9}), 1, ref::from_tensor(index), ref::from_tensor(g));
  EXPECT_TRUE(all_close(x.grad(), expected, 1e-5, 1e-5));
}

// ---------------------------------------------------------------- errors

TEST(IndexingErrors, MessagesNameOpAndShapes) {
  Tensor x = zeros({2, 4});
  EXPECT_EMBER_ERROR(index_select(x, 1, from_vector<int64_t>({0, 5})), "index_select", "index 5", "[0, 4)");
  EXPECT_EMBER_ERROR(index_select(x, 1, from_vector<int64_t>({-1})), "index_select", "index -1", "[0, 4)");
  EXPECT_EMBER_ERROR(index_select(x, 0, from_vector<float>({0})), "index_select", "float32");
  EXPECT_EMBER_ERROR(index_select(x, 2, from_vector<int64_t>({0})), "index_select", "dim 2");
  EXPECT_EMBER_ERROR(index_select(x, 0, zeros({1, 1}, {DType::i64})), "index_select", "[1, 1]");
  EXPECT_EMBER_ERROR(cat({x, zeros({2, 3}), zeros({3, 4})}, 0), "cat", "tensor 1", "[2, 4]", "[2, 3]");
  EXPECT_EMBER_ERROR(cat({x, zeros({2, 4, 1})}, 0), "cat", "tensor 1", "[2, 4, 1]");
  EXPECT_EMBER_ERROR(cat({}, 0), "cat", "non-empty");
  EXPECT_EMBER_ERROR(cat({scalar_tensor(1.0)}, 0), "cat", "zero-dimensional");
  EXPECT_EMBER_ERROR(stack({x, zeros({3, 4})}, 0), "stack", "[2, 4]", "[3, 4]", "tensor 1");
  EXPECT_EMBER_ERROR(stack({x}, 3), "stack", "dim 3");
  EXPECT_EMBER_ERROR(split(x, std::vector<int64_t>{1, 2}, 1), "split", "[1, 2]", "3", "4");
  EXPECT_EMBER_ERROR(split(x, std::vector<int64_t>{3, -1}, 0), "split", "-1");
  EXPECT_EMBER_ERROR(split(x, 0, 1), "split", "split_size", "0");
  EXPECT_EMBER_ERROR(chunk(x, 0), "chunk", "0");
  EXPECT_EMBER_ERROR(chunk(x, -2), "chunk", "-2");
  EXPECT_EMBER_ERROR(gather(x, 1, zeros({2}, {DType::i64})), "gather", "[2]", "[2, 4]");
  EXPECT_EMBER_ERROR(gather(x, 1, zeros({3, 1}, {DType::i64})), "gather", "[3, 1]", "[2, 4]", "dim 0");
  EXPECT_EMBER_ERROR(gather(x, 1, full({2, 2}, 4, {DType::i64})), "gather", "index 4", "[0, 4)");
  EXPECT_EMBER_ERROR(gather(x, 0, zeros({2, 2}, {DType::f64})), "gather", "float64");
  EXPECT_EMBER_ERROR(scatter_add(x, 0, full({1, 4}, 2, {DType::i64}), zeros({1, 4})), "scatter_add", "index 2", "[0, 2)");
  EXPECT_EMBER_ERROR(scatter_add(x, 0, zeros({1, 4}, {DType::i64}), zeros({1, 3})), "scatter_add", "[1, 4]", "[1, 3]");
  EXPECT_EMBER_ERROR(scatter_add(x, 0, zeros({1, 4}, {DType::i64}), zeros({1, 4}, {DType::f64})), "scatter_add", "float64",
                     "float32");
  EXPECT_EMBER_ERROR(one_hot(from_vector<int64_t>({1, 3}), 3), "one_hot", "3", "[0, 3)");
  EXPECT_EMBER_ERROR(one_hot(from_vector<int64_t>({-1}), 3), "one_hot", "-1");
  EXPECT_EMBER_ERROR(one_hot(from_vector<float>({1})), "one_hot", "float32");
}
