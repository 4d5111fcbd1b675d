// What a user's translation unit calls, compiled by tests/consumers/warnings
// with -Wall -Wextra -Wpedantic -Werror (for this machine's instruction set
// and for the baseline one): every serving entry point (plan, append in
// both forms, attend, merge) with float rows over a bf16 cache and bf16
// rows over a float cache, the tensor API and the config reader. It fails (exit 1) unless a
// closed form holds: every value is 1, so every output row is 1, and a
// state merged with itself keeps its rows and adds log 2 to its lse.
#include <cmath>
#include <cstdio>
#include <vector>

#include <rope/attention.hpp>
#include <rope/hf_config.hpp>
#include <rope/rope.hpp>

namespace {

namespace ra = rope::attention;

template <class Row, class E>
bool serve(const rope::Table<float>& table) {
  constexpr std::size_t tokens = 6, q_heads = 4, kv_heads = 2, d = 16;
  std::vector<E> k_pool(tokens * kv_heads * d), v_pool(k_pool.size());
  const auto cache = ra::PagedCache<E>::contiguous(rope::View<E>::token_major(k_pool.data(), tokens, kv_heads, d),
                                                   rope::View<E>::token_major(v_pool.data(), tokens, kv_heads, d));
  std::vector<Row> q(tokens * q_heads * d, Row(0.5f)), k(tokens * kv_heads * d, Row(0.25f));
  std::vector<Row> v(k.size(), Row(1.0f)), out(q.size());
  std::vector<float> lse(tokens * q_heads), merged(q.size()), merged_lse(lse.size());
  ra::Plan plan;
  ra::plan(plan, ra::Shape::of(cache, q_heads), 0, tokens - 1, 2);
  ra::AppendOptions options;
  options.rotation = {&table, rope::Style::rotate_half};
  const auto q_view = rope::View<Row>::token_major(q.data(), tokens - 1, q_heads, d);
  ra::append(plan, cache, q_view, rope::View<const Row>::token_major(k.data(), tokens - 1, kv_heads, d),
             rope::View<const Row>::token_major(v.data(), tokens - 1, kv_heads, d), q_view, options);
  ra::plan(plan, ra::Shape::of(cache, q_heads), tokens - 1, 1, 1);
  ra::append(plan, cache, rope::View<const Row>::token_major(k.data(), 1, kv_heads, d),
             rope::View<const Row>::token_major(v.data(), 1, kv_heads, d), options);
  const auto out_view = rope::View<Row>::token_major(out.data(), 1, q_heads, d);
  ra::attend(plan, cache, rope::View<const Row>(q_view).slice_tokens(0, 1), out_view, ra::Logits{}, ra::Mask{},
             lse.data());
  ra::merge(rope::View<const Row>(out_view), lse.data(), rope::View<const Row>(out_view), lse.data(),
            rope::View<float>::token_major(merged.data(), 1, q_heads, d), merged_lse.data());
  bool ok = true;
  for (std::size_t i = 0; i < q_heads * d; ++i) ok = ok && static_cast<float>(out[i]) == 1.0f && merged[i] == 1.0f;
  for (std::size_t h = 0; h < q_heads; ++h) ok = ok && std::fabs(merged_lse[h] - lse[h] - std::log(2.0f)) < 1e-6f;
  return ok;
}

}  // namespace

int main() {
  const rope::Table<float> table(rope::frequencies(16, 10000.0), 64);
  std::vector<float> x(2 * 4 * 16, 1.0f);
  rope::apply(rope::View<float>::token_major(x.data(), 2, 4, 16), table, rope::Style::block_diagonal, 0);
  std::vector<rope::BFloat16> xb(x.size(), rope::BFloat16(1.0f));
  rope::apply(rope::View<rope::BFloat16>::token_major(xb.data(), 2, 4, 16), table, rope::Style::rotate_half, 3);
  const rope::hf::ModelRope model =
      rope::hf::parse(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000})");
  // float rows over a bf16 cache, bf16 rows over a float cache: each entry
  // point with both row types and both cache types, in two instantiations.
  const bool ok = serve<float, rope::BFloat16>(table) && serve<rope::BFloat16, float>(table) && model.head_dim == 16 &&
                  model.style == rope::Style::rotate_half;
  std::printf("rope warnings consumer: every entry point with float and bf16: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
