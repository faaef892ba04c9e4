// core/forced_choice.h: the environment variable, the setter, and the error for a bad name.
#include <cstdlib>

#include "core/forced_choice.h"
#include "test_util.h"

using namespace ember;

namespace {

enum class Fruit { Apple, Pear, Plum };

ForcedChoice<Fruit> make() {
  return ForcedChoice<Fruit>("EMBER_TEST_FRUIT", {{"apple", Fruit::Apple}, {"pear", Fruit::Pear}, {"plum", Fruit::Plum}});
}

}  // namespace

TEST(ForcedChoice, UnsetOrEmptyLeavesTheAutomaticChoice) {
  ::unsetenv("EMBER_TEST_FRUIT");
  EXPECT_FALSE(make().get().has_value());
  ::setenv("EMBER_TEST_FRUIT", "", 1);
  EXPECT_FALSE(make().get().has_value());
}

TEST(ForcedChoice, TheVariableNamesTheChoiceAndTheSetterOverridesIt) {
  ::setenv("EMBER_TEST_FRUIT", "plum", 1);
  ForcedChoice<Fruit> c = make();
  ASSERT_TRUE(c.get().has_value());
  EXPECT_EQ(*c.get(), Fruit::Plum);
  c.set(Fruit::Apple);
  EXPECT_EQ(*c.get(), Fruit::Apple);  // Apple is 0: must not read as "automatic"
  c.set(std::nullopt);
  EXPECT_FALSE(c.get().has_value());
  EXPECT_STREQ(c.name(Fruit::Pear), "pear");
  ::unsetenv("EMBER_TEST_FRUIT");
}

TEST(ForcedChoice, AnUnknownNameIsAnErrorListingTheNames) {
  ::setenv("EMBER_TEST_FRUIT", "banana", 1);
  EXPECT_EMBER_ERROR(make(), "EMBER_TEST_FRUIT", "expected apple, pear or plum", "'banana'");
  ::unsetenv("EMBER_TEST_FRUIT");
}
