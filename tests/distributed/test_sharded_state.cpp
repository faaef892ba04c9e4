// Pieces of global tensors on disk (distributed/sharded_state.h): any range reads back from the
// files that hold it, and files whose pieces overlap, leave a gap or lie about their place are
// refused naming the file and the elements.
#include <map>
#include <string>
#include <vector>

#include "distributed/sharded_state.h"
#include "nn/io/safetensors.h"
#include "test_util.h"

namespace {

using namespace ember;
using namespace ember::distributed;

// 0, 1, 2, ... as a tensor of `shape`.
Tensor counting(const Shape& shape) {
  std::vector<float> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return from_vector<float>(v, shape);
}

// The elements [first, first + n) of a counting tensor, as a piece of `shape`.
TensorPiece piece(const Shape& shape, int64_t first, int64_t n) {
  return TensorPiece{shape, first, counting(shape).reshape({numel_of(shape)}).narrow(0, first, n).contiguous()};
}

TEST(ShardedState, AnyRangeReadsBackAcrossThePiecesOfThreeFiles) {
  ember::testing::TempDir dir("sharded_state");
  const Shape w{4, 5};  // 20 elements split 7 / 7 / 6; "b" lives in the last file only
  std::vector<std::string> files;
  for (int r = 0; r < 3; ++r) {
    PieceMap m{{"w", piece(w, 7 * r, r == 2 ? 6 : 7)}};
    if (r == 2) m["b"] = whole_piece(counting({3}));
    files.push_back(dir.file("s" + std::to_string(r) + ".safetensors"));
    save_shard_file(files.back(), m, {{"group.0.lr", 0.5}});
  }
  const PieceReader reader = PieceReader::open_shards(files);
  EXPECT_EQ(reader.keys(), (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(reader.shape("w"), w);
  EXPECT_EQ(reader.scalars().at("group.0.lr"), 0.5);
  EXPECT_EQ(reader.read_whole("w").to_vector<float>(), counting(w).to_vector<float>());
  EXPECT_EQ(reader.read_whole("w").shape(), w);
  // A range that starts in the first file and ends in the third.
  EXPECT_EQ(reader.read("w", 5, 11).to_vector<float>(), counting({20}).narrow(0, 5, 11).contiguous().to_vector<float>());
  EXPECT_EQ(reader.read("w", 9, 0).numel(), 0);
  EXPECT_EMBER_ERROR(reader.read("w", 15, 6), "'w' has 20 elements", "[15, 21)");
  EXPECT_EMBER_ERROR(reader.read("v", 0, 1), "holds no tensor 'v'");
}

TEST(ShardedState, OverlapsGapsAndMissingFilesAreRefusedNamingTheElements) {
  ember::testing::TempDir dir("sharded_state_bad");
  const Shape w{10};
  auto write = [&](const std::string& name, int64_t first, int64_t n) {
    save_shard_file(dir.file(name), {{"w", piece(w, first, n)}}, {});
    return dir.file(name);
  };
  const std::string a = write("a", 0, 6), b = write("b", 4, 6), c = write("c", 7, 3);
  EXPECT_EMBER_ERROR(PieceReader::open_shards({a, b}), "elements [4, 6) of 'w' are in two pieces");
  EXPECT_EMBER_ERROR(PieceReader::open_shards({a, c}), "elements [6, 7) of 'w' are in no file");
  EXPECT_EMBER_ERROR(PieceReader::open_shards({a}), "elements [6, 10) of 'w'", "is a shard file missing?");
  EXPECT_EMBER_ERROR(PieceReader::open_shards({a, dir.file("gone")}), "gone is missing");
  // An ordinary safetensors file is not a shard file.
  nn::save_safetensors(dir.file("plain"), {{"w", counting(w)}});
  EXPECT_EMBER_ERROR(PieceReader::open_shards({dir.file("plain")}), "plain", "not a shard file");
  EXPECT_EQ(PieceReader::open_whole(dir.file("plain")).read("w", 2, 3).to_vector<float>(),
            (std::vector<float>{2, 3, 4}));
  // A piece said to lie beyond its tensor.
  save_shard_file(dir.file("beyond"), {{"w", TensorPiece{w, 8, counting({4})}}}, {});
  EXPECT_EMBER_ERROR(PieceReader::open_shards({dir.file("beyond")}), "beyond", "[8, 12)", "outside its shape");
}

TEST(ShardedState, RangeReadsReadOnlyThoseBytesAndCheckTheRange) {
  ember::testing::TempDir dir("sharded_state_range");
  nn::save_safetensors(dir.file("t"), {{"x", counting({3, 4})}, {"y", counting({2})}});
  EXPECT_EQ(nn::load_safetensors_range(dir.file("t"), "x", 5, 4).to_vector<float>(), (std::vector<float>{5, 6, 7, 8}));
  EXPECT_EMBER_ERROR(nn::load_safetensors_range(dir.file("t"), "x", 10, 3), "'x' has 12 elements", "[10, 13)");
  EXPECT_EMBER_ERROR(nn::load_safetensors_range(dir.file("t"), "z", 0, 1), "no tensor 'z'");
}

}  // namespace
