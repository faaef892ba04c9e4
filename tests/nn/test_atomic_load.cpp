// nn::Module::load_state_dict checks every key, shape and dtype before it copies anything: a
// refused dict leaves every parameter and buffer bitwise as it was.
#include <cmath>

#include "bitwise_snapshot.h"
#include "core/grad_mode.h"
#include "nn/layers/basic.h"
#include "test_util.h"

using namespace ember;
using ember::testing::tensors_bytes;

namespace {

// Keys in sorted order: "count", "fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight".
class TwoLayers : public nn::Module {
 public:
  explicit TwoLayers(double fill) : Module("TwoLayers") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 3));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(3, 2));
    register_buffer("count", full({1}, fill, {.dtype = DType::i64}));
    NoGradGuard ng;
    for (auto& p : parameters()) p.copy_(full(p.shape(), fill));
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

}  // namespace

TEST(AtomicLoad, WrongShapeAfterAGoodKeyLoadsNothing) {
  TwoLayers target(1.0), source(2.0);
  const auto before = tensors_bytes(target.state_dict());
  nn::StateDict sd = source.state_dict();
  sd["fc2.weight"] = zeros({5, 5});  // after fc1.* and fc2.bias, which are fine
  EXPECT_EMBER_ERROR(target.load_state_dict(sd), "load_state_dict (TwoLayers)", "'fc2.weight'", "[5, 5]", "[2, 3]",
                     "nothing was loaded");
  EXPECT_EQ(tensors_bytes(target.state_dict()), before);
  // Non-strict too: the missing key is reported, the bad shape still refuses everything.
  sd.erase("fc1.bias");
  EXPECT_EMBER_ERROR(target.load_state_dict(sd, /*strict=*/false), "'fc2.weight'", "[5, 5]");
  EXPECT_EQ(tensors_bytes(target.state_dict()), before);
  // Every mismatch is named at once.
  sd["fc1.weight"] = zeros({1});
  EXPECT_EMBER_ERROR(target.load_state_dict(sd, false), "'fc1.weight' has shape [1]", "'fc2.weight' has shape [5, 5]");
  EXPECT_EQ(tensors_bytes(target.state_dict()), before);
}

TEST(AtomicLoad, WrongDtypeLoadsNothing) {
  TwoLayers target(1.0), source(3.0);
  const auto before = tensors_bytes(target.state_dict());
  nn::StateDict sd = source.state_dict();
  sd["fc2.weight"] = zeros({2, 3}, {.dtype = DType::i64});
  EXPECT_EMBER_ERROR(target.load_state_dict(sd), "'fc2.weight'", "dtype int64", "float32");
  EXPECT_EQ(tensors_bytes(target.state_dict()), before);
  sd = source.state_dict();
  sd["count"] = full({1}, 3.0);  // float into the int64 buffer
  EXPECT_EMBER_ERROR(target.load_state_dict(sd), "'count'", "dtype float32", "int64");
  EXPECT_EQ(tensors_bytes(target.state_dict()), before);
  sd["count"] = Tensor();
  EXPECT_EMBER_ERROR(target.load_state_dict(sd), "'count' is undefined");
  EXPECT_EQ(tensors_bytes(target.state_dict()), before);
}

TEST(AtomicLoad, FloatingDtypesStillConvertAndGoodDictsLoad) {
  TwoLayers target(1.0), source(0.5);
  nn::StateDict sd = source.state_dict();
  for (auto& [k, t] : sd)
    if (t.is_floating_point()) t = t.to(DType::f64);
  target.load_state_dict(sd);
  EXPECT_EQ(target.fc2->weight.dtype(), DType::f32);
  EXPECT_EQ(target.fc2->weight.to_vector<float>(), std::vector<float>(6, 0.5f));
  EXPECT_EQ(tensors_bytes(target.state_dict()), tensors_bytes(source.state_dict()));
}

TEST(AtomicLoad, ValidateStateDictChecksWithoutLoading) {
  TwoLayers target(1.0), source(2.0);
  const auto before = tensors_bytes(target.state_dict());
  nn::StateDict sd = source.state_dict();
  sd.erase("count");
  sd["extra"] = zeros({1});
  EXPECT_EMBER_ERROR(target.validate_state_dict(sd), "missing keys", "count", "unexpected keys", "extra");
  const nn::LoadReport r = target.validate_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"count"});
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"extra"});
  EXPECT_EQ(tensors_bytes(target.state_dict()), before);
  EXPECT_TRUE(nn::loadable_dtype(DType::bf16, DType::f32));
  EXPECT_FALSE(nn::loadable_dtype(DType::i32, DType::i64));
}
