// The attention module's threads: every call gives the same bits for any
// thread count, because each work item is computed the same way whichever
// thread takes it (detail::parallel_for). Run under ThreadSanitizer too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>

#include "attention_heads.hpp"
#include "attention_oracle.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Matrix;
using ra::Rotation;
using rope::Style;
using rope::View;

template <class T>
class ThreadsTyped : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ThreadsTyped, Scalars, rope_test::ScalarNames);

template <class T>
double tolerance() {
  return at::exact_tolerance<T>();
}

// max |got - want| / max |want| over one head of an output tensor.
template <class T>
double head_error(const Heads<T>& out, std::size_t h, const at::Mat& want) {
  return at::relative_error(out.head(h), want);
}



using at::LinearCase;


// Threads split (key/value head, query block) items, each computed the same
// way: any thread count gives the same bytes, also with fewer heads than
// threads (prefill query blocks) and for one decode token.
TEST(AttentionThreads, SoftmaxBitIdenticalForAnyThreadCount) {
  const std::size_t l = 50, hq = 8, hk = 2, d = 16, dv = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  const Heads<float> q(l, hq, d, 41), k(l, hk, d, 42), v(l, hk, dv, 43);
  for (const std::size_t tokens : {l, std::size_t{1}}) {
    ra::SoftmaxOptions o;
    o.causal = true;
    o.block = 16;
    o.q_offset = static_cast<std::int64_t>(l - tokens);
    const auto qv = q.view().slice_tokens(l - tokens, tokens);
    Heads<float> one(tokens, hq, dv, 0);
    ra::softmax<float>(qv, k.view(), v.view(), one.view(), {&table, Style::rotate_half}, o);
    for (const std::size_t threads : {2, 3, 7, 64}) {
      o.threads = threads;
      Heads<float> many(tokens, hq, dv, 0);
      ra::softmax<float>(qv, k.view(), v.view(), many.view(), {&table, Style::rotate_half}, o);
      EXPECT_TRUE(at::same_bytes(one.data, many.data)) << "tokens " << tokens << " threads " << threads;
    }
  }
}


TEST(AttentionThreads, LinearBitIdenticalForAnyThreadCount) {
  const LinearCase<float> c(81);
  const auto& [table, feature_table, q, k, v, phi] = c;
  for (const bool causal : {false, true}) {
    ra::LinearOptions o;
    o.causal = causal;
    o.chunk = 6;
    Heads<float> one(c.l, c.hq, c.dv, 0);
    ra::linear_eq19<float>(q.view(), k.view(), v.view(), one.view(), phi, {&feature_table, Style::rotate_half}, o);
    for (const std::size_t threads : {2, 3, 16}) {
      o.threads = threads;
      Heads<float> many(c.l, c.hq, c.dv, 0);
      ra::linear_eq19<float>(q.view(), k.view(), v.view(), many.view(), phi, {&feature_table, Style::rotate_half}, o);
      EXPECT_TRUE(at::same_bytes(one.data, many.data)) << "causal " << causal << " threads " << threads;
    }
  }
}

}  // namespace
