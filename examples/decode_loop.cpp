// A decoder's attention loop: prefill a prompt into a KV cache, then decode
// one token at a time, each step appending its key (rotated once, where the
// cache keeps it) and value and attending over the whole cache. Every output
// must equal the same token's row of one causal call over the whole
// sequence: the cache changes how the work is done, not the result. Exits 1
// otherwise.
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
  options.causal = true;
  options.threads = 2;

  // The reference: one causal call over the whole sequence.
  std::vector<float> once(q.size());
  ra::softmax<float>(q_view, k_view, v_view, rope::View<float>::token_major(once.data(), tokens, q_heads, head_dim),
                     rotation, options);

  // The loop: a cache with room for 64 tokens, the prompt in one step, then
  // one token per step.
  constexpr std::size_t capacity = 64;
  std::vector<float> k_cache(capacity * kv_heads * head_dim), v_cache(k_cache.size());
  ra::KvCache<float> cache{rope::View<float>::token_major(k_cache.data(), capacity, kv_heads, head_dim),
                           rope::View<float>::token_major(v_cache.data(), capacity, kv_heads, head_dim), 0};
  std::vector<float> stepped(q.size());
  const auto out_view = rope::View<float>::token_major(stepped.data(), tokens, q_heads, head_dim);
  ra::softmax_step<float>(q_view.slice_tokens(0, prompt), k_view.slice_tokens(0, prompt),
                          v_view.slice_tokens(0, prompt), cache, out_view.slice_tokens(0, prompt), rotation, options);
  for (std::size_t t = prompt; t < tokens; ++t) {
    ra::softmax_step<float>(q_view.slice_tokens(t, 1), k_view.slice_tokens(t, 1), v_view.slice_tokens(t, 1), cache,
                            out_view.slice_tokens(t, 1), rotation, options);
  }

  double worst = 0;
  for (std::size_t i = 0; i < q.size(); ++i) worst = std::max(worst, double(std::fabs(stepped[i] - once[i])));
  std::printf("rope decode loop: %zu prompt tokens, then %zu steps; cache holds %zu tokens\n", prompt, generated,
              cache.length);
  std::printf("max |step output - one-shot causal output| = %.2e\n", worst);
  return cache.length == tokens && worst < 1e-5 ? 0 : 1;
}
