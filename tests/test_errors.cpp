// Bad input to every checked entry point: the call throws the documented
// exception (std::invalid_argument, or std::out_of_range for positions),
// its message names the rejected argument and shows its value, and the
// caller's output buffers are byte for byte what they were before the call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <rope/angles.hpp>
#include <rope/apply.hpp>
#include <rope/frequencies.hpp>
#include <rope/table.hpp>

namespace {

namespace scaling = rope::scaling;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs f, which must throw E; returns the message ("" and a failure if not).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// The message names `argument` and shows `value` as written in it.
void expect_names(const std::string& msg, const std::string& argument, const std::string& value) {
  EXPECT_NE(msg.find(argument), std::string::npos) << "message does not name " << argument << ": " << msg;
  EXPECT_NE(msg.find(value), std::string::npos) << "message does not show " << value << ": " << msg;
}

void expect_rejected(const rope::Scaling& scaling, const std::string& argument, const std::string& value,
                     std::size_t rotary_dim = 64, std::size_t seq_len = 0) {
  SCOPED_TRACE(argument + " = " + value);
  const auto msg = message_of<std::invalid_argument>(
      [&] { rope::frequencies(rotary_dim, 10000.0, scaling, seq_len); });
  expect_names(msg, argument, value);
}

TEST(Errors, FrequenciesRotaryDimAndBase) {
  for (std::size_t r : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{127},
                        std::numeric_limits<std::size_t>::max()}) {
    const auto msg = message_of<std::invalid_argument>([&] { rope::frequencies(r); });
    expect_names(msg, "rotary_dim", std::to_string(r));
  }
  const std::pair<double, const char*> bases[] = {{1.0, "1"},     {0.5, "0.5"}, {0.0, "0"},
                                                  {-10.0, "-10"}, {kNaN, "nan"}, {kInf, "inf"},
                                                  {-kInf, "-inf"}};
  for (const auto& bad : bases) {
    const double base = bad.first;  // a named copy: lambdas cannot capture a structured binding in C++17
    const auto msg = message_of<std::invalid_argument>([&] { rope::frequencies(64, base); });
    expect_names(msg, "base", bad.second);
  }
}

// A factor of every variant: zero (the default of a forgotten field),
// negative, NaN and infinite are rejected by name.
TEST(Errors, ScalingFactors) {
  const std::pair<double, const char*> bad[] = {{0.0, "0"}, {-2.0, "-2"}, {kNaN, "nan"}, {kInf, "inf"}};
  for (const auto& [v, text] : bad) {
    expect_rejected(scaling::Linear{v}, "scaling::Linear::factor", text);
    expect_rejected(scaling::Ntk{v}, "scaling::Ntk::factor", text);
    expect_rejected(scaling::DynamicNtk{v, 4096}, "scaling::DynamicNtk::factor", text, 64, 8192);
    scaling::Yarn yarn;
    yarn.factor = v;
    yarn.original_max_positions = 4096;
    expect_rejected(yarn, "scaling::Yarn::factor", text);
    scaling::Llama3 llama;
    llama.factor = v;
    expect_rejected(llama, "scaling::Llama3::factor", text);
  }
  // Fields left at their defaults of 0.
  expect_rejected(scaling::Linear{}, "scaling::Linear::factor", "0");
  expect_rejected(scaling::Ntk{}, "scaling::Ntk::factor", "0");
  expect_rejected(scaling::Yarn{}, "scaling::Yarn::factor", "0");
}

TEST(Errors, ScalingLengthsAndShapes) {
  expect_rejected(scaling::DynamicNtk{2.0, 0}, "scaling::DynamicNtk::original_max_positions", "0");
  // NTK's exponent r/(r-2) needs rotary_dim > 2.
  expect_rejected(scaling::Ntk{2.0}, "rotary_dim", "2", 2);
  expect_rejected(scaling::DynamicNtk{2.0, 16}, "rotary_dim", "2", 2, 32);

  scaling::Yarn yarn;
  yarn.factor = 4.0;
  expect_rejected(yarn, "scaling::Yarn::original_max_positions", "0");
  yarn.original_max_positions = 4096;
  for (auto [field, member] : {std::pair{"scaling::Yarn::beta_fast", &scaling::Yarn::beta_fast},
                               std::pair{"scaling::Yarn::beta_slow", &scaling::Yarn::beta_slow}}) {
    auto y = yarn;
    y.*member = 0.0;
    expect_rejected(y, field, "0");
    y.*member = kNaN;
    expect_rejected(y, field, "nan");
  }
  {
    auto y = yarn;
    y.mscale = kNaN;
    expect_rejected(y, "scaling::Yarn::mscale", "nan");
    y = yarn;
    y.mscale_all_dim = kInf;
    expect_rejected(y, "scaling::Yarn::mscale_all_dim", "inf");
    y = yarn;
    y.attention_factor = -1.0;
    expect_rejected(y, "scaling::Yarn::attention_factor", "-1");
  }

  scaling::Llama3 llama;
  llama.low_freq_factor = 0.0;
  expect_rejected(llama, "scaling::Llama3::low_freq_factor", "0");
  llama = scaling::Llama3{};
  llama.high_freq_factor = kNaN;
  expect_rejected(llama, "scaling::Llama3::high_freq_factor", "nan");
  llama = scaling::Llama3{};
  llama.original_max_positions = 0;
  expect_rejected(llama, "scaling::Llama3::original_max_positions", "0");

  scaling::LongRope lr;
  lr.short_factor.assign(32, 1.0);
  lr.long_factor.assign(32, 2.0);
  lr.original_max_positions = 4096;
  lr.max_positions = 131072;
  ASSERT_NO_THROW(rope::frequencies(64, 10000.0, lr, 8192));
  {
    auto b = lr;
    b.short_factor.resize(31);
    expect_rejected(b, "scaling::LongRope::short_factor.size()", "31");
    b = lr;
    b.long_factor.resize(33, 1.0);
    expect_rejected(b, "scaling::LongRope::long_factor.size()", "33");
    b = lr;
    b.long_factor[7] = 0.0;
    expect_rejected(b, "scaling::LongRope::long_factor[7]", "0");
    b = lr;
    b.short_factor[31] = kNaN;
    expect_rejected(b, "scaling::LongRope::short_factor[31]", "nan");
    b = lr;
    b.original_max_positions = 1;
    expect_rejected(b, "scaling::LongRope::original_max_positions", "1");
    b = lr;
    b.max_positions = 0;
    expect_rejected(b, "scaling::LongRope::max_positions", "0");
    b = lr;
    b.factor = 0.0;
    expect_rejected(b, "scaling::LongRope::factor", "0");
    b = lr;
    b.attention_factor = -2.0;
    expect_rejected(b, "scaling::LongRope::attention_factor", "-2");
  }

  for (const double prf : {-0.25, 1.5, kNaN}) {
    expect_rejected(scaling::Proportional{prf, 1.0}, "scaling::Proportional::partial_rotary_factor",
                    rope::detail::to_text(prf));
  }
  expect_rejected(scaling::Proportional{0.25, 0.0}, "scaling::Proportional::factor", "0");
  expect_rejected(scaling::Proportional{0.25, kInf}, "scaling::Proportional::factor", "inf");

  scaling::Custom custom;
  custom.inv_freq.assign(32, 0.5);
  ASSERT_NO_THROW(rope::frequencies(64, 10000.0, custom));
  {
    auto b = custom;
    b.inv_freq.resize(5);
    expect_rejected(b, "scaling::Custom::inv_freq.size()", "5");
    b = custom;
    b.inv_freq[3] = -1.0;
    expect_rejected(b, "scaling::Custom::inv_freq[3]", "-1");
    b = custom;
    b.inv_freq[0] = kInf;
    expect_rejected(b, "scaling::Custom::inv_freq[0]", "inf");
    b = custom;
    b.attention_factor = 0.0;
    expect_rejected(b, "scaling::Custom::attention_factor", "0");
  }
}

// rotary_dim and base are checked before any variant's fields.
TEST(Errors, RotaryDimAndBaseAreCheckedFirst) {
  const auto msg = message_of<std::invalid_argument>([] { rope::frequencies(7, 10000.0, scaling::Linear{}); });
  expect_names(msg, "rotary_dim", "7");
  const auto msg2 = message_of<std::invalid_argument>([] { rope::frequencies(8, 0.5, scaling::Linear{}); });
  expect_names(msg2, "base", "0.5");
}

TEST(Errors, TableRejectsEmptyFrequencies) {
  const auto msg = message_of<std::invalid_argument>([] { rope::Table<float>(rope::Frequencies{}, 16); });
  EXPECT_NE(msg.find("inv_freq"), std::string::npos) << msg;
}

// positions * rotary_dim must not wrap around: a table too large for memory
// is refused by name, never allocated short and written past its end.
TEST(Errors, TableRefusesASizeThatOverflows) {
  const std::size_t positions = std::numeric_limits<std::size_t>::max() / 4 + 1;  // * 4 wraps to 0
  try {
    rope::Table<float> table(rope::frequencies(4), positions);
    FAIL() << "no exception";
  } catch (const rope::invalid_argument& e) {
    EXPECT_EQ(e.function(), "rope::Table");
    EXPECT_EQ(e.argument(), "positions");
    EXPECT_NE(std::string(e.what()).find("positions must be at most"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("got " + std::to_string(positions)), std::string::npos)
        << e.what();
  }
}

// A scaling whose fields are each valid but whose result overflows is refused.
TEST(Errors, ScalingThatOverflowsInvFreqIsRefused) {
  try {
    rope::frequencies(4, 10000.0, rope::scaling::Linear{1e-310});
    FAIL() << "no exception";
  } catch (const rope::invalid_argument& e) {
    EXPECT_EQ(e.function(), "rope::frequencies");
    EXPECT_NE(std::string(e.what()).find("inv_freq[0] = inf"), std::string::npos) << e.what();
  }
}

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

// rope::angles: every rejected argument leaves both output rows untouched.
template <class T>
void expect_angles_rejected(const rope::Frequencies& f, std::size_t position, bool null_cos, bool null_sin,
                            const std::string& argument, const std::string& value, bool out_of_range) {
  SCOPED_TRACE(argument);
  std::vector<T> cos(8), sin(8);
  for (std::size_t i = 0; i < 8; ++i) {
    cos[i] = static_cast<T>(-1000.0 - double(i));
    sin[i] = static_cast<T>(2000.0 + double(i));
  }
  const auto cos_before = cos, sin_before = sin;
  const auto call = [&] { rope::angles<T>(f, position, null_cos ? nullptr : cos.data(), null_sin ? nullptr : sin.data()); };
  const auto msg = out_of_range ? message_of<std::out_of_range>(call) : message_of<std::invalid_argument>(call);
  expect_names(msg, argument, value);
  EXPECT_EQ(std::memcmp(cos.data(), cos_before.data(), 8 * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(sin.data(), sin_before.data(), 8 * sizeof(T)), 0);
}

TEST(Errors, AnglesRejectsAndWritesNothing) {
  const auto f = rope::frequencies(16);
  const std::size_t past = rope::kMaxExactPosition + 1;
  expect_angles_rejected<float>(rope::Frequencies{}, 0, false, false, "inv_freq", "empty", false);
  expect_angles_rejected<float>(f, 0, true, false, "cos_out", "null", false);
  expect_angles_rejected<double>(f, 0, false, true, "sin_out", "null", false);
  expect_angles_rejected<float>(f, past, false, false, "position", std::to_string(past), true);
  expect_angles_rejected<double>(f, std::numeric_limits<std::size_t>::max(), false, false, "position",
                                 std::to_string(std::numeric_limits<std::size_t>::max()), true);
}


// The tensor API. Every case starts from a valid call, breaks one argument,
// and checks the exception, that its message names the argument and shows
// the value, and that every buffer (inputs and outputs) is byte for byte
// what it was.
class TensorApiErrors : public ::testing::Test {
 protected:
  static constexpr std::size_t kTokens = 3, kHeads = 4, kKvHeads = 2, kHeadDim = 72, kRotaryDim = 64;
  static constexpr std::size_t kPositions = 16;

  TensorApiErrors() : table_(rope::frequencies(kRotaryDim), kPositions) {
    for (auto* b : {&q_, &k_, &q_out_, &k_out_}) {
      b->resize(kTokens * kHeads * kHeadDim);
      for (std::size_t i = 0; i < b->size(); ++i) (*b)[i] = static_cast<float>(b == &q_ ? i : 3 * i + 1);
    }
    ids_ = {0, 5, 15};
  }

  rope::View<float> q() { return rope::View<float>::token_major(q_.data(), kTokens, kHeads, kHeadDim); }
  rope::View<float> k() { return rope::View<float>::token_major(k_.data(), kTokens, kKvHeads, kHeadDim); }
  rope::View<float> q_out() { return rope::View<float>::token_major(q_out_.data(), kTokens, kHeads, kHeadDim); }
  rope::View<float> k_out() { return rope::View<float>::token_major(k_out_.data(), kTokens, kKvHeads, kHeadDim); }

  template <class E, class F>
  void expect_rejected(F&& call, const std::string& argument, const std::string& value) {
    SCOPED_TRACE(argument + " = " + value);
    const auto before = std::vector<std::vector<float>>{q_, k_, q_out_, k_out_};
    const auto ids_before = ids_;
    const auto msg = message_of<E>(call);
    expect_names(msg, argument, value);
    const auto after = std::vector<std::vector<float>>{q_, k_, q_out_, k_out_};
    for (std::size_t i = 0; i < before.size(); ++i) {
      EXPECT_EQ(std::memcmp(before[i].data(), after[i].data(), before[i].size() * sizeof(float)), 0)
          << "buffer " << i << " was written by a rejected call";
    }
    EXPECT_EQ(ids_, ids_before);
  }

  rope::Table<float> table_;
  std::vector<float> q_, k_, q_out_, k_out_;
  std::vector<std::int64_t> ids_;
};

TEST_F(TensorApiErrors, ValidCallsSucceed) {
  // The baseline every other case breaks in one place.
  EXPECT_NO_THROW(rope::apply(q(), table_, rope::Style::rotate_half, ids_.data()));
  EXPECT_NO_THROW(rope::apply_qk(q(), k(), table_, rope::Style::block_diagonal, ids_.data()));
}

TEST_F(TensorApiErrors, Views) {
  using rope::Style;
  for (std::size_t threads : {std::size_t{1}, std::size_t{3}}) {
    rope::Options o;
    o.threads = threads;
    auto v = q();
    v.data = nullptr;
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::rotate_half, ids_.data(), o); },
                                           "x.data", "null");
    v = q();
    v.head_dim = 0;
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::rotate_half, ids_.data(), o); },
                                           "x.head_dim", "0");
    v = rope::View<float>(q_.data(), kTokens, kHeads, 30, kHeads * 30, 30);  // 30 < rotary_dim 64
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::rotate_half, ids_.data(), o); },
                                           "head_dim", "30");
    v = q();
    v.head_stride = kHeadDim - 1;  // neighbouring heads would overlap
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::block_diagonal, ids_.data(), o); },
                                           "x.head_stride", std::to_string(kHeadDim - 1));
    v = q();
    v.token_stride = 10;
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::block_diagonal, ids_.data(), o); },
                                           "x.token_stride", "10");
  }
}

TEST_F(TensorApiErrors, Options) {
  using rope::Style;
  rope::Options o;
  o.rotary_dim = 7;
  expect_rejected<std::invalid_argument>([&] { rope::apply(q(), table_, Style::rotate_half, ids_.data(), o); },
                                         "options.rotary_dim", "7");
  o.rotary_dim = kRotaryDim + 2;
  expect_rejected<std::invalid_argument>([&] { rope::apply(q(), table_, Style::rotate_half, ids_.data(), o); },
                                         "options.rotary_dim", std::to_string(kRotaryDim + 2));
  o = rope::Options{};
  o.threads = 0;
  expect_rejected<std::invalid_argument>([&] { rope::apply(q(), table_, Style::rotate_half, ids_.data(), o); },
                                         "options.threads", "0");
}

TEST_F(TensorApiErrors, Positions) {
  using rope::Style;
  for (std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    rope::Options o;
    o.threads = threads;
    expect_rejected<std::invalid_argument>(
        [&] { rope::apply(q(), table_, Style::rotate_half, static_cast<const std::int64_t*>(nullptr), o); },
        "positions", "null");
    // The last token is bad: nothing of the earlier, valid tokens may be written.
    for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{kPositions}, std::numeric_limits<std::int64_t>::max(),
                             std::numeric_limits<std::int64_t>::min()}) {
      ids_[2] = bad;
      expect_rejected<std::out_of_range>([&] { rope::apply(q(), table_, Style::rotate_half, ids_.data(), o); },
                                         "position", std::to_string(bad));
      expect_rejected<std::out_of_range>(
          [&] { rope::apply_qk(q(), k(), table_, Style::block_diagonal, ids_.data(), o); }, "position",
          std::to_string(bad));
    }
    ids_ = {0, 5, 15};
    expect_rejected<std::out_of_range>([&] { rope::apply(q(), table_, Style::rotate_half, std::int64_t{-3}, o); },
                                       "offset", "-3");
    // Offset 14: tokens at 14, 15, 16, and 16 is past the table.
    expect_rejected<std::out_of_range>([&] { rope::apply(q(), table_, Style::rotate_half, std::int64_t{14}, o); },
                                       "position", "16");
  }
}

TEST_F(TensorApiErrors, OutOfPlaceShapesAndOverlap) {
  using rope::Style;
  const rope::View<const float> x = q();
  auto out = q_out();
  out.heads = kHeads - 1;
  expect_rejected<std::invalid_argument>([&] { rope::apply<float>(x, out, table_, Style::rotate_half, ids_.data()); },
                                         "out", std::to_string(kHeads - 1));
  // out is x shifted by one head: neither the same view nor disjoint.
  const auto shifted = rope::View<float>(q_.data() + kHeadDim, kTokens - 1, kHeads, kHeadDim, kHeads * kHeadDim,
                                         kHeadDim);
  const rope::View<const float> x2 = rope::View<float>(q_.data(), kTokens - 1, kHeads, kHeadDim, kHeads * kHeadDim,
                                                       kHeadDim);
  expect_rejected<std::invalid_argument>(
      [&] { rope::apply<float>(x2, shifted, table_, Style::rotate_half, ids_.data()); }, "out", "overlaps");
}

TEST_F(TensorApiErrors, ApplyQk) {
  using rope::Style;
  auto k3 = rope::View<float>::token_major(k_.data(), kTokens, 3, kHeadDim);  // 4 % 3 != 0
  expect_rejected<std::invalid_argument>([&] { rope::apply_qk(q(), k3, table_, Style::rotate_half, ids_.data()); },
                                         "k.heads", "3");
  auto k_short = k();
  k_short.tokens = kTokens - 1;
  expect_rejected<std::invalid_argument>(
      [&] { rope::apply_qk(q(), k_short, table_, Style::rotate_half, ids_.data()); }, "k.tokens",
      std::to_string(kTokens - 1));
  auto k_null = k();
  k_null.data = nullptr;
  expect_rejected<std::invalid_argument>([&] { rope::apply_qk(q(), k_null, table_, Style::rotate_half, ids_.data()); },
                                         "k.data", "null");
  // k_out written over q_out: two outputs sharing memory.
  const auto k_over_q = rope::View<float>::token_major(q_out_.data(), kTokens, kKvHeads, kHeadDim);
  expect_rejected<std::invalid_argument>(
      [&] {
        rope::apply_qk<float>(rope::View<const float>(q()), rope::View<const float>(k()), q_out(), k_over_q, table_,
                              Style::rotate_half, ids_.data());
      },
      "k_out", "overlaps");
}

}  // namespace
