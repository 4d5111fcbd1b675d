// A model's step before attention, Qwen3-style: the fused QKV projection
// gives one f32 row per token ([q_heads + 2 kv_heads] heads of head_dim),
// Q and K get a per-head RMSNorm with their own weights (QK-norm), then RoPE
// from a rope::Table, and K and V go into a paged bf16 cache (pages of 16
// tokens) -- all of it one append call per step, at the positions and slots
// the step's plan derived, Q rotated into its own buffer. attend then reads
// the cache. Three sequences are prefilled together, then decoded a few
// steps, one token each.
//
// Two checks per step. Exits 1 unless both hold:
//  - the fused step, bit for bit, against its parts done plainly: RMSNorm in
//    float in the order append.hpp documents, rope::apply, and one rounding
//    of K and V into bf16 in their slots;
//  - attention, against rope::attention::softmax over an f32 copy of each
//    sequence's cache read back from its pages: within 1e-5.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

namespace {

constexpr std::size_t kQHeads = 8, kKvHeads = 2, kDim = 64, kHeads = kQHeads + 2 * kKvHeads;
constexpr std::size_t kPageSize = 16, kPoolPages = 12, kMaxPagesPerSequence = 4;
constexpr float kEps = 1e-6f;

// RMSNorm of one head in float, in append.hpp's order: channel c into sum
// c % 8 by fused multiply-adds, the eight sums added pairwise, then
// (x / rms) * w.
void rms_norm(const float* x, std::size_t n, const float* w, float* y) {
  float s[8] = {};
  for (std::size_t c = 0; c < n; ++c) s[c % 8] = std::fma(x[c], x[c], s[c % 8]);
  const float ss = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + kEps);
  for (std::size_t c = 0; c < n; ++c) y[c] = (x[c] * r) * w[c];
}

// Every head of one side (a view into the fused buffer) normalized into
// dense rows [tokens, heads, head_dim].
std::vector<float> normalized(const rope::View<float>& x, const std::vector<float>& w) {
  std::vector<float> y(x.tokens * x.heads * x.head_dim);
  for (std::size_t t = 0; t < x.tokens; ++t) {
    for (std::size_t h = 0; h < x.heads; ++h) rms_norm(x.row(t, h), x.head_dim, w.data(), &y[(t * x.heads + h) * kDim]);
  }
  return y;
}

// One sequence's keys (or values) read back from its pages as f32 rows
// [length, kv_heads, head_dim].
std::vector<float> gather(const ra::PagePool<rope::BFloat16>& pool, const std::int32_t* pages, std::size_t length) {
  std::vector<float> rows(length * pool.heads * pool.head_dim);
  for (std::size_t j = 0; j < length; ++j) {
    const std::size_t slot = static_cast<std::size_t>(pages[j / pool.page_size]) * pool.page_size + j % pool.page_size;
    for (std::size_t h = 0; h < pool.heads; ++h) {
      for (std::size_t c = 0; c < pool.head_dim; ++c) {
        rows[(j * pool.heads + h) * pool.head_dim + c] = static_cast<float>(pool.row(slot, h)[c]);
      }
    }
  }
  return rows;
}

}  // namespace

int main() {
  const rope::Table<float> table(rope::frequencies(kDim, 1000000.0), 4096);
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  std::vector<float> q_weight(kDim), k_weight(kDim);
  for (auto* w : {&q_weight, &k_weight}) {
    std::generate(w->begin(), w->end(), [&] { return 1.0f + 0.2f * normal(gen); });
  }

  const std::size_t pool_size = kPoolPages * kPageSize * kKvHeads * kDim;
  std::vector<rope::BFloat16> k_pool(pool_size), v_pool(pool_size);
  const ra::PagedCache<rope::BFloat16> cache{
      ra::PagePool<rope::BFloat16>::nhd(k_pool.data(), kPoolPages, kPageSize, kKvHeads, kDim),
      ra::PagePool<rope::BFloat16>::nhd(v_pool.data(), kPoolPages, kPageSize, kKvHeads, kDim)};

  ra::AppendOptions append;
  append.rotation = {&table, rope::Style::rotate_half};
  append.q_norm = {q_weight.data(), kDim};
  append.k_norm = {k_weight.data(), kDim};
  append.eps = kEps;
  ra::Shape shape = ra::Shape::of(cache, kQHeads);
  shape.kv_split = 16;
  ra::Plan plan;

  const std::vector<std::size_t> prompts = {7, 21, 30};
  constexpr std::size_t steps = 6;
  const std::size_t sequences = prompts.size();
  std::vector<std::int32_t> free_pages = {4, 9, 1, 11, 6, 0, 8, 3, 10, 2, 7, 5};
  std::vector<std::int32_t> block_table(sequences * kMaxPagesPerSequence, -1);
  std::vector<std::size_t> pages_held(sequences, 0);
  std::vector<std::int64_t> lengths(sequences, 0), q_starts(sequences + 1, 0);
  bool fused_ok = true, attention_ok = true;
  double worst = 0;
  for (std::size_t step = 0; step <= steps; ++step) {
    std::size_t tokens = 0;
    for (std::size_t b = 0; b < sequences; ++b) {
      const std::size_t n = step == 0 ? prompts[b] : 1;
      q_starts[b + 1] = q_starts[b] + static_cast<std::int64_t>(n);
      lengths[b] += static_cast<std::int64_t>(n);
      tokens += n;
      while (pages_held[b] * kPageSize < static_cast<std::size_t>(lengths[b])) {
        block_table[b * kMaxPagesPerSequence + pages_held[b]++] = free_pages.front();
        free_pages.erase(free_pages.begin());
      }
    }
    // The step's plan: each new token's position and slot, from the lengths.
    ra::plan(plan, shape, {q_starts.data(), lengths.data(), block_table.data(), kMaxPagesPerSequence, sequences}, 2);
    const std::vector<std::int64_t> positions(plan.positions(), plan.positions() + tokens);

    // The fused projection's output, and the step before attention.
    std::vector<float> qkv(tokens * kHeads * kDim);
    std::generate(qkv.begin(), qkv.end(), [&] { return 2.0f * normal(gen); });
    const auto parts = rope::split_qkv(qkv.data(), tokens, kQHeads, kKvHeads, kDim);
    std::vector<float> q_out(tokens * kQHeads * kDim);
    const auto q_view = rope::View<float>::token_major(q_out.data(), tokens, kQHeads, kDim);
    const std::vector<rope::BFloat16> k_before = k_pool, v_before = v_pool;
    ra::append(plan, cache, parts.q, parts.k, parts.v, q_view, append);

    // The same by parts: norm, rope::apply, one rounding into the slots.
    const std::vector<float> q_norm = normalized(parts.q, q_weight), k_norm = normalized(parts.k, k_weight);
    std::vector<float> q_want(q_norm.size()), k_want(k_norm.size());
    rope::apply<float>(rope::View<const float>::token_major(q_norm.data(), tokens, kQHeads, kDim),
                       rope::View<float>::token_major(q_want.data(), tokens, kQHeads, kDim), table,
                       rope::Style::rotate_half, positions.data());
    rope::apply<float>(rope::View<const float>::token_major(k_norm.data(), tokens, kKvHeads, kDim),
                       rope::View<float>::token_major(k_want.data(), tokens, kKvHeads, kDim), table,
                       rope::Style::rotate_half, positions.data());
    fused_ok = fused_ok && std::memcmp(q_out.data(), q_want.data(), q_out.size() * sizeof(float)) == 0;
    std::vector<rope::BFloat16> k_pool_want = k_before, v_pool_want = v_before;
    const auto k_pool_view =
        ra::PagePool<rope::BFloat16>::nhd(k_pool_want.data(), kPoolPages, kPageSize, kKvHeads, kDim);
    const auto v_pool_view =
        ra::PagePool<rope::BFloat16>::nhd(v_pool_want.data(), kPoolPages, kPageSize, kKvHeads, kDim);
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t h = 0; h < kKvHeads; ++h) {
        rope::BFloat16* k_row = k_pool_view.row(static_cast<std::size_t>(plan.slot(t)), h);
        rope::BFloat16* v_row = v_pool_view.row(static_cast<std::size_t>(plan.slot(t)), h);
        for (std::size_t c = 0; c < kDim; ++c) {
          k_row[c] = rope::BFloat16(k_want[(t * kKvHeads + h) * kDim + c]);
          v_row[c] = rope::BFloat16(parts.v.row(t, h)[c]);
        }
      }
    }
    fused_ok = fused_ok && std::memcmp(k_pool.data(), k_pool_want.data(), pool_size * sizeof(rope::BFloat16)) == 0 &&
               std::memcmp(v_pool.data(), v_pool_want.data(), pool_size * sizeof(rope::BFloat16)) == 0;

    // Attention over the cache, and over an f32 copy of each sequence's.
    std::vector<float> out(tokens * kQHeads * kDim);
    ra::attend(plan, cache, q_view, rope::View<float>::token_major(out.data(), tokens, kQHeads, kDim));
    for (std::size_t b = 0; b < sequences; ++b) {
      const auto n = static_cast<std::size_t>(q_starts[b + 1] - q_starts[b]);
      const auto length = static_cast<std::size_t>(lengths[b]), first = static_cast<std::size_t>(q_starts[b]);
      const std::int32_t* pages = block_table.data() + b * kMaxPagesPerSequence;
      const std::vector<float> kc = gather(cache.k, pages, length), vc = gather(cache.v, pages, length);
      std::vector<float> want(n * kQHeads * kDim);
      ra::SoftmaxOptions plain;
      plain.mask.causal = true;
      plain.q_offset = static_cast<std::int64_t>(length - n);
      ra::softmax<float>(rope::View<const float>(q_view).slice_tokens(first, n),
                         rope::View<const float>::token_major(kc.data(), length, kKvHeads, kDim),
                         rope::View<const float>::token_major(vc.data(), length, kKvHeads, kDim),
                         rope::View<float>::token_major(want.data(), n, kQHeads, kDim), {}, plain);
      for (std::size_t i = 0; i < want.size(); ++i) {
        const double e = std::fabs(double(out[first * kQHeads * kDim + i]) - double(want[i]));
        worst = std::max(worst, e);
        attention_ok = attention_ok && e <= 1e-5;
      }
    }
  }
  std::printf("rope pre-attention: %zu sequences (prompts %zu, %zu, %zu), %zu decode steps, %zu/%zu heads of %zu,\n",
              sequences, prompts[0], prompts[1], prompts[2], steps, kQHeads, kKvHeads, kDim);
  std::printf("  per-head QK-norm + RoPE + bf16 pages of %zu in one call\n", kPageSize);
  std::printf("fused step = norm, rope::apply, bf16 rounding bit for bit: %s\n", fused_ok ? "yes" : "NO");
  std::printf("max |attend - softmax over the f32 copy| = %.2e (limit 1e-5)\n", worst);
  return fused_ok && attention_ok ? 0 : 1;
}
