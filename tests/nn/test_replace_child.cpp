// Module::replace_child: the new child takes the old one's name and place, Sequential and
// ModuleList run it, and a module that reaches its child through a member of its own refuses
// (changing nothing) unless it re-points the member in on_child_replaced.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "test_util.h"

using namespace ember;

namespace {

std::vector<std::string> child_names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, child] : m.named_children()) out.push_back(name);
  return out;
}

// Holds its child in a member, as most models do.
class Holder : public nn::Module {
 public:
  explicit Holder(bool follows) : Module("Holder"), follows_(follows) {
    inner = register_module("inner", std::make_shared<nn::Linear>(3, 2));
    register_module("after", std::make_shared<nn::ReLU>());
  }
  Tensor forward(const Tensor& x) override { return inner->forward(x); }
  std::shared_ptr<nn::Module> inner;

 protected:
  bool on_child_replaced(const std::string& name, const std::shared_ptr<nn::Module>&,
                         const std::shared_ptr<nn::Module>& module) override {
    if (!follows_) return false;
    if (name == "inner") inner = module;
    return true;
  }

 private:
  bool follows_;
};

}  // namespace

TEST(ReplaceChild, SequentialRunsTheNewChildUnderTheSameName) {
  auto first = std::make_shared<nn::Linear>(3, 4);
  auto seq = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{first, std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(4, 2)});
  auto replacement = std::make_shared<nn::Linear>(3, 4);
  {
    NoGradGuard no_grad;
    replacement->weight.fill_(0.0);
    replacement->bias.fill_(-1.0);  // ReLU then zeroes everything: the output is the last bias
  }
  const auto old = seq->replace_child("1", std::make_shared<nn::ReLU>());
  EXPECT_EQ(old->type_name(), "ReLU");
  EXPECT_EQ(seq->replace_child("0", replacement), first);
  EXPECT_EQ((*seq)[0], replacement);
  EXPECT_EQ(child_names(*seq), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(seq->named_parameters()[0].second.impl(), replacement->weight.impl());
  const Tensor y = seq->forward(ember::testing::random_tensor({5, 3}));
  const auto last = std::dynamic_pointer_cast<nn::Linear>((*seq)[2]);
  const std::vector<float> bias = last->bias.to_vector<float>();
  const std::vector<float> got = y.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], bias[i % 2]) << i;
}

TEST(ReplaceChild, ModuleListHandsOutTheNewChild) {
  auto list = std::make_shared<nn::ModuleList>();
  list->push_back(std::make_shared<nn::Linear>(2, 2));
  list->push_back(std::make_shared<nn::Linear>(2, 3));
  auto replacement = std::make_shared<nn::ReLU>();
  list->replace_child("1", replacement);
  EXPECT_EQ((*list)[1], replacement);
  EXPECT_EQ(*(list->begin() + 1), replacement);
  EXPECT_EQ(list->num_parameters(), 2 * 2 + 2);
}

TEST(ReplaceChild, APlainModuleAcceptsAndAMemberHolderMustFollow) {
  auto plain = std::make_shared<nn::Module>();
  plain->register_module("a", std::make_shared<nn::ReLU>());
  auto linear = std::make_shared<nn::Linear>(2, 2);
  plain->replace_child("a", linear);
  EXPECT_EQ(plain->named_children()[0].second, linear);

  auto following = std::make_shared<Holder>(true);
  auto replacement = std::make_shared<nn::Linear>(3, 2);
  following->replace_child("inner", replacement);
  EXPECT_EQ(following->inner, replacement);
  EXPECT_EQ(following->named_children()[0].second, replacement);
}

TEST(ReplaceChild, RefusalsNameTheModuleAndChangeNothing) {
  auto holder = std::make_shared<Holder>(false);
  const auto before = holder->inner;
  EXPECT_EMBER_ERROR(holder->replace_child("inner", std::make_shared<nn::ReLU>()),
                     "Holder: cannot replace its child 'inner' (Linear)", "on_child_replaced");
  EXPECT_EQ(holder->inner, before);
  EXPECT_EQ(holder->named_children()[0].second, before);
  EXPECT_EMBER_ERROR(holder->replace_child("missing", std::make_shared<nn::ReLU>()),
                     "Holder: replace_child: no child named 'missing'");
  EXPECT_EMBER_ERROR(holder->replace_child("inner", nullptr), "Holder", "the new module is null");
}
