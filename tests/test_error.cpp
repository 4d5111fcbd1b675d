// rope's error types (error.hpp): rope::invalid_argument and
// rope::out_of_range derive from the standard exceptions, carry the public
// function and the argument as the caller spelled them, and open their
// message with both.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <rope/apply.hpp>
#include <rope/error.hpp>
#include <rope/frequencies.hpp>
#include <rope/table.hpp>

namespace {

// Errors are rope's own types, caught as the standard ones too, and carry
// the function and the argument as the caller spelled them.
TEST(Errors, CarryFunctionAndArgumentNames) {
  std::vector<float> x(4 * 8);
  const rope::Table<float> table(rope::frequencies(8), 16);
  auto view = rope::View<float>::token_major(x.data(), 4, 1, 8);
  try {
    rope::apply(view, table, rope::Style::rotate_half, 13);
    FAIL() << "no exception";
  } catch (const rope::out_of_range& e) {
    EXPECT_EQ(e.function(), "rope::apply");
    EXPECT_EQ(e.argument(), "offset + 3 (the position of token 3)");
    const std::out_of_range& as_std = e;
    EXPECT_NE(std::string(as_std.what()).find("got 16"), std::string::npos) << as_std.what();
  }
  rope::Options options;
  options.rotary_dim = 3;
  try {
    rope::apply(view, table, rope::Style::rotate_half, 0, options);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const auto* ours = dynamic_cast<const rope::invalid_argument*>(&e);
    ASSERT_NE(ours, nullptr) << "not a rope::invalid_argument: " << e.what();
    EXPECT_EQ(ours->function(), "rope::apply");
    EXPECT_EQ(ours->argument(), "options.rotary_dim");
  }
}

TEST(Errors, ConstructedErrorsKeepTheirNames) {
  const rope::invalid_argument a("rope::f", "x.y", "rope::f: x.y must be even, got 3");
  EXPECT_EQ(a.function(), "rope::f");
  EXPECT_EQ(a.argument(), "x.y");
  EXPECT_STREQ(a.what(), "rope::f: x.y must be even, got 3");
  const rope::out_of_range b("rope::g", "positions[2]", "m");
  const std::out_of_range& as_std = b;
  EXPECT_STREQ(as_std.what(), "m");
  EXPECT_EQ(b.argument(), "positions[2]");
}

}  // namespace
