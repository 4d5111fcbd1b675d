// A server's decode loop over a paged bf16 KV cache: three requests with
// prompts of different lengths are prefilled in one batch, then decoded
// together, one token per request per step, every step one call of
// softmax_batch_step (it rotates each new key at its position, rounds K and
// V once into bf16 in their slots, and attends). Pages are handed out from a
// free list as the sequences grow, so their pages interleave in the pool.
//
// Two checks per step, on every output row. Exits 1 unless both hold:
//  - against rope::attention::softmax over an f32 copy of the very cache
//    (each request's keys and values read back from its pages, widened):
//    within 1e-5, which is float rounding only;
//  - against the same loop over an f32 paged cache: within the bound that
//    rounding K and V once into bf16 allows (docs/attention.md), max|v' - v|
//    + (exp(2 eps) - 1) max|v| with eps = max_j |scale q.(k'_j - k_j)|, plus
//    1e-5 of float rounding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

namespace {

constexpr std::size_t kQHeads = 8, kKvHeads = 2, kGroup = kQHeads / kKvHeads, kDim = 64;
constexpr std::size_t kPageSize = 16, kPoolPages = 12, kMaxPagesPerSequence = 4;

// One request's keys (or values) read back from its pages as f32 rows
// [length, kv_heads, head_dim].
template <class E>
std::vector<float> gather(const ra::PagePool<E>& pool, const std::int32_t* pages, std::size_t length) {
  std::vector<float> rows(length * pool.heads * pool.head_dim);
  for (std::size_t j = 0; j < length; ++j) {
    const std::size_t slot = static_cast<std::size_t>(pages[j / pool.page_size]) * pool.page_size + j % pool.page_size;
    for (std::size_t h = 0; h < pool.heads; ++h) {
      const E* row = pool.row(slot, h);
      for (std::size_t c = 0; c < pool.head_dim; ++c) {
        rows[(j * pool.heads + h) * pool.head_dim + c] = static_cast<float>(row[c]);
      }
    }
  }
  return rows;
}

}  // namespace

int main() {
  const rope::Table<float> table(rope::frequencies(kDim, 500000.0), 4096);
  const ra::Rotation<float> rotation{&table, rope::Style::rotate_half};

  // The pools: [pages, page_size, kv_heads, head_dim] for K and for V, in
  // bf16 and, for the comparison, in f32.
  const std::size_t pool_size = kPoolPages * kPageSize * kKvHeads * kDim;
  std::vector<rope::BFloat16> k16(pool_size), v16(pool_size);
  std::vector<float> k32(pool_size), v32(pool_size);
  const ra::PagedCache<rope::BFloat16> cache16{
      ra::PagePool<rope::BFloat16>::nhd(k16.data(), kPoolPages, kPageSize, kKvHeads, kDim),
      ra::PagePool<rope::BFloat16>::nhd(v16.data(), kPoolPages, kPageSize, kKvHeads, kDim)};
  const ra::PagedCache<float> cache32{ra::PagePool<float>::nhd(k32.data(), kPoolPages, kPageSize, kKvHeads, kDim),
                                      ra::PagePool<float>::nhd(v32.data(), kPoolPages, kPageSize, kKvHeads, kDim)};

  // The requests, their block tables and the pool's free pages.
  const std::vector<std::size_t> prompts = {5, 19, 33};
  constexpr std::size_t steps = 12;
  const std::size_t sequences = prompts.size();
  std::vector<std::int32_t> free_pages = {7, 2, 9, 0, 5, 11, 3, 8, 1, 10, 6, 4};
  std::vector<std::int32_t> block_table(sequences * kMaxPagesPerSequence, -1);
  std::vector<std::size_t> pages_held(sequences, 0);
  std::vector<std::int64_t> lengths(sequences, 0), q_starts(sequences + 1, 0);

  ra::BatchOptions options;
  options.rotation = rotation;
  options.kv_split = 16;  // split a decode token's keys in parts of 16 (aligned at multiples of 16)
  options.threads = 2;
  ra::BatchWorkspace workspace16, workspace32;  // kept between steps: nothing allocated once grown

  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  double worst_copy = 0, worst_excess = -1e300, worst_f32 = 0;
  bool ok = true;
  for (std::size_t step = 0; step <= steps; ++step) {
    // This step's batch: the whole prompt at step 0, then one token each.
    std::size_t tokens = 0;
    for (std::size_t b = 0; b < sequences; ++b) {
      const std::size_t n = step == 0 ? prompts[b] : 1;
      q_starts[b + 1] = q_starts[b] + static_cast<std::int64_t>(n);
      lengths[b] += static_cast<std::int64_t>(n);
      tokens += n;
      // A page for every slot the request now needs.
      while (pages_held[b] * kPageSize < static_cast<std::size_t>(lengths[b])) {
        block_table[b * kMaxPagesPerSequence + pages_held[b]++] = free_pages.front();
        free_pages.erase(free_pages.begin());
      }
    }
    const ra::Batch batch{q_starts.data(), lengths.data(), block_table.data(), kMaxPagesPerSequence, sequences};

    // What the Q, K and V projections give for this step's tokens, packed.
    std::vector<float> q(tokens * kQHeads * kDim), k(tokens * kKvHeads * kDim), v(k.size());
    for (auto* x : {&q, &k, &v}) std::generate(x->begin(), x->end(), [&] { return normal(gen); });
    const auto qv = rope::View<const float>::token_major(q.data(), tokens, kQHeads, kDim);
    const auto kv = rope::View<const float>::token_major(k.data(), tokens, kKvHeads, kDim);
    const auto vv = rope::View<const float>::token_major(v.data(), tokens, kKvHeads, kDim);
    std::vector<float> out16(tokens * kQHeads * kDim), out32(out16.size());
    ra::softmax_batch_step(qv, kv, vv, cache16, batch,
                           rope::View<float>::token_major(out16.data(), tokens, kQHeads, kDim), options, &workspace16);
    ra::softmax_batch_step(qv, kv, vv, cache32, batch,
                           rope::View<float>::token_major(out32.data(), tokens, kQHeads, kDim), options, &workspace32);

    // The queries rotated at their positions, for the bound's eps.
    std::vector<std::int64_t> positions(tokens);
    for (std::size_t b = 0; b < sequences; ++b) {
      for (std::int64_t t = q_starts[b]; t < q_starts[b + 1]; ++t) {
        positions[static_cast<std::size_t>(t)] = lengths[b] - (q_starts[b + 1] - q_starts[b]) + (t - q_starts[b]);
      }
    }
    std::vector<float> q_rotated(q.size());
    rope::apply<float>(qv, rope::View<float>::token_major(q_rotated.data(), tokens, kQHeads, kDim), table,
                       rotation.style, positions.data());

    for (std::size_t b = 0; b < sequences; ++b) {
      const std::size_t n = static_cast<std::size_t>(q_starts[b + 1] - q_starts[b]);
      const std::size_t length = static_cast<std::size_t>(lengths[b]), first = static_cast<std::size_t>(q_starts[b]);
      const std::int32_t* pages = block_table.data() + b * kMaxPagesPerSequence;
      // softmax over an f32 copy of this request's bf16 cache, keys as stored.
      const std::vector<float> kc = gather(cache16.k, pages, length), vc = gather(cache16.v, pages, length);
      const std::vector<float> kf = gather(cache32.k, pages, length), vf = gather(cache32.v, pages, length);
      std::vector<float> want(n * kQHeads * kDim);
      ra::SoftmaxOptions plain;
      plain.causal = true;
      plain.keys_rotated = true;
      plain.q_offset = static_cast<std::int64_t>(length - n);
      ra::softmax<float>(qv.slice_tokens(first, n),
                         rope::View<const float>::token_major(kc.data(), length, kKvHeads, kDim),
                         rope::View<const float>::token_major(vc.data(), length, kKvHeads, kDim),
                         rope::View<float>::token_major(want.data(), n, kQHeads, kDim), rotation, plain);
      const double scale = 1.0 / std::sqrt(double(kDim));
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t t = first + i, visible = length - n + i + 1;
        for (std::size_t h = 0; h < kQHeads; ++h) {
          const std::size_t g = h / kGroup;
          // The bound of the bf16 cache against the f32 one, over the keys
          // this row sees.
          double eps = 0, dv_max = 0, v_max = 0;
          for (std::size_t j = 0; j < visible; ++j) {
            double dot = 0;
            for (std::size_t c = 0; c < kDim; ++c) {
              const std::size_t at = (j * kKvHeads + g) * kDim + c;
              dot += double(q_rotated[(t * kQHeads + h) * kDim + c]) * (double(kc[at]) - double(kf[at]));
              dv_max = std::max(dv_max, std::fabs(double(vc[at]) - double(vf[at])));
              v_max = std::max(v_max, std::fabs(double(vf[at])));
            }
            eps = std::max(eps, std::fabs(scale * dot));
          }
          const double bound = dv_max + std::expm1(2 * eps) * v_max;
          for (std::size_t c = 0; c < kDim; ++c) {
            const std::size_t at = (t * kQHeads + h) * kDim + c;
            const double copy = std::fabs(double(out16[at]) - double(want[(i * kQHeads + h) * kDim + c]));
            const double f32 = std::fabs(double(out16[at]) - double(out32[at]));
            worst_copy = std::max(worst_copy, copy);
            worst_f32 = std::max(worst_f32, f32);
            worst_excess = std::max(worst_excess, f32 - bound);
            ok = ok && copy <= 1e-5 && f32 <= bound + 1e-5;
          }
        }
      }
    }
  }
  std::printf("rope batch decode: %zu requests (prompts %zu, %zu, %zu), %zu decode steps, bf16 pages of %zu tokens\n",
              sequences, prompts[0], prompts[1], prompts[2], steps, kPageSize);
  std::printf("max |bf16 batch - softmax over its f32 copy| = %.2e (limit 1e-5)\n", worst_copy);
  std::printf("max |bf16 batch - f32 batch| = %.2e; max excess over the rounding bound = %.2e (limit 1e-5)\n",
              worst_f32, worst_excess);
  return ok ? 0 : 1;
}
