// A decoder's attention loop over one sequence's contiguous cache: prefill a
// prompt, then decode one token at a time. Each step is planned (the plan
// of one sequence: a contiguous cache is one page of its capacity), then
// append rotates Q and the new keys (once, where the cache keeps them) and
// writes K and V, and attend reads the whole cache. Every output must equal
// the same token's row of one causal call over the whole sequence: the
// cache changes how the work is done, not the result. Exits 1 otherwise.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

int main() {
  // A small grouped-query layer: 8 query heads share 2 key/value heads of 64.
  constexpr std::size_t prompt = 24, generated = 16, tokens = prompt + generated;
  constexpr std::size_t q_heads = 8, kv_heads = 2, head_dim = 64;
  const rope::Table<float> table(rope::frequencies(head_dim, 500000.0), 4096);
  const ra::Rotation<float> rotation{&table, rope::Style::rotate_half};

  // What the Q, K and V projections would give for every token.
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(tokens * q_heads * head_dim), k(tokens * kv_heads * head_dim), v(k.size());
  for (auto* x : {&q, &k, &v}) std::generate(x->begin(), x->end(), [&] { return normal(gen); });
  const auto q_view = rope::View<const float>::token_major(q.data(), tokens, q_heads, head_dim);
  const auto k_view = rope::View<const float>::token_major(k.data(), tokens, kv_heads, head_dim);
  const auto v_view = rope::View<const float>::token_major(v.data(), tokens, kv_heads, head_dim);

  ra::SoftmaxOptions options;
  options.mask.causal = true;
  options.threads = 2;

  // The reference: one causal call over the whole sequence.
  std::vector<float> once(q.size());
  ra::softmax<float>(q_view, k_view, v_view, rope::View<float>::token_major(once.data(), tokens, q_heads, head_dim),
                     rotation, options);

  // The loop: a cache with room for 64 tokens, the prompt in one step, then
  // one token per step; each step's Q rotated into q_rotated.
  constexpr std::size_t capacity = 64;
  std::vector<float> k_cache(capacity * kv_heads * head_dim), v_cache(k_cache.size());
  const auto cache =
      ra::PagedCache<float>::contiguous(rope::View<float>::token_major(k_cache.data(), capacity, kv_heads, head_dim),
                                        rope::View<float>::token_major(v_cache.data(), capacity, kv_heads, head_dim));
  ra::AppendOptions append;
  append.rotation = rotation;
  std::vector<float> stepped(q.size()), q_rotated(q.size());
  const auto out_view = rope::View<float>::token_major(stepped.data(), tokens, q_heads, head_dim);
  const auto q_rotated_view = rope::View<float>::token_major(q_rotated.data(), tokens, q_heads, head_dim);
  ra::Plan plan;
  std::size_t cached = 0;  // tokens the cache holds
  while (cached < tokens) {
    const std::size_t t = cached, n = cached == 0 ? prompt : 1;
    ra::plan(plan, ra::Shape::of(cache, q_heads), cached, n, 2);
    ra::append(plan, cache, q_view.slice_tokens(t, n), k_view.slice_tokens(t, n), v_view.slice_tokens(t, n),
               q_rotated_view.slice_tokens(t, n), append);
    ra::attend(plan, cache, q_rotated_view.slice_tokens(t, n), out_view.slice_tokens(t, n));
    cached += n;
  }

  double worst = 0;
  for (std::size_t i = 0; i < q.size(); ++i) worst = std::max(worst, double(std::fabs(stepped[i] - once[i])));
  std::printf("rope decode loop: %zu prompt tokens, then %zu steps; cache holds %zu tokens\n", prompt, generated,
              cached);
  std::printf("max |step output - one-shot causal output| = %.2e\n", worst);
  return cached == tokens && worst < 1e-5 ? 0 : 1;
}
