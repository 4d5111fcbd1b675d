// A speculative-decoding verify step with a tree of drafts (EAGLE, Medusa):
// a request with 48 cached tokens proposes 7 draft tokens as a tree (a
// root, two children, four grandchildren); the step attends all 7 at once,
// each seeing the cache and its own ancestors only (Batch::tree_depths and
// tree_masks, rope/attention/tree.hpp), in one batch with another request
// decoding one token and a third prefilling a chunk of 20.
//
// Checked against the plain path: for each draft token, the chain of its
// ancestors and itself, appended as an ordinary causal chunk after the same
// cached tokens (a sequence of its own that lists the request's cached
// pages), then attended. The draft token's row must equal the chain's last
// row bit for bit: the same keys at the same positions, in the same order,
// through the same decode loop, one work item each (the root's chain, one
// decode token, is split at kv_split keys only past 512). Exits 1 unless
// every row does.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

namespace {

constexpr std::size_t kQHeads = 8, kKvHeads = 2, kDim = 64, kPageSize = 16, kPoolPages = 32, kStride = 4;
constexpr std::size_t kCached = 48, kDrafts = 7;
constexpr int kParent[kDrafts] = {-1, 0, 0, 1, 1, 2, 2};

}  // namespace

int main() {
  std::vector<float> k_pool(kPoolPages * kPageSize * kKvHeads * kDim), v_pool(k_pool.size());
  ra::PagedCache<float> cache{ra::PagePool<float>::nhd(k_pool.data(), kPoolPages, kPageSize, kKvHeads, kDim),
                              ra::PagePool<float>::nhd(v_pool.data(), kPoolPages, kPageSize, kKvHeads, kDim)};
  const rope::Table<float> table(rope::frequencies(kDim, 10000.0), 256);
  ra::AppendOptions options;
  options.rotation = {&table, rope::Style::rotate_half};
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  const auto random_rows = [&](std::size_t n, std::size_t heads) {
    std::vector<float> x(n * heads * kDim);
    for (float& y : x) y = normal(gen);
    return x;
  };
  const auto view = [](std::vector<float>& x, std::size_t n, std::size_t heads) {
    return rope::View<float>::token_major(x.data(), n, heads, kDim);
  };
  ra::Plan plan;
  ra::Shape shape = ra::Shape::of(cache, kQHeads);

  // The three requests' caches: 48, 30 and 12 tokens, pages of their own.
  // Request 0's cached pages are 0 .. 2, its drafts go to page 3.
  std::vector<std::int32_t> tables = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  {
    const std::int64_t starts[4] = {0, 48, 78, 90}, lengths[3] = {48, 30, 12};
    ra::plan(plan, shape, ra::Batch{starts, lengths, tables.data(), kStride, 3});
    std::vector<float> k = random_rows(90, kKvHeads), v = random_rows(90, kKvHeads);
    ra::append(plan, cache, view(k, 90, kKvHeads), view(v, 90, kKvHeads), options);
  }

  // The step: 7 drafts for request 0, one token for 1, a chunk of 20 for 2.
  std::vector<std::int32_t> depths(kDrafts + 1 + 20, -1);
  std::vector<std::uint64_t> masks(depths.size(), 0);
  for (std::size_t i = 0; i < kDrafts; ++i) {
    for (int a = static_cast<int>(i); a >= 0; a = kParent[a]) {
      masks[i] |= std::uint64_t{1} << a;
      ++depths[i];
    }
  }
  const std::int64_t starts[4] = {0, kDrafts, kDrafts + 1, kDrafts + 21};
  const std::int64_t lengths[3] = {kCached + kDrafts, 31, 32};
  ra::Batch batch{starts, lengths, tables.data(), kStride, 3};
  batch.tree_depths = depths.data();
  batch.tree_masks = masks.data();
  batch.tree_mask_words = 1;
  ra::plan(plan, shape, batch);
  const std::size_t tokens = plan.tokens();
  std::vector<float> q = random_rows(tokens, kQHeads), k = random_rows(tokens, kKvHeads),
                     v = random_rows(tokens, kKvHeads), out(tokens * kQHeads * kDim);
  const std::vector<float> q_raw(q.begin(), q.begin() + kDrafts * kQHeads * kDim);
  ra::append(plan, cache, view(q, tokens, kQHeads), view(k, tokens, kKvHeads), view(v, tokens, kKvHeads),
             view(q, tokens, kQHeads), options);
  ra::attend(plan, cache, view(q, tokens, kQHeads), view(out, tokens, kQHeads));

  // Each draft's chain: the cached pages 0 .. 2, then the chain on page 12.
  bool ok = true;
  const std::size_t row = kQHeads * kDim, kv_row = kKvHeads * kDim;
  for (std::size_t i = 0; i < kDrafts; ++i) {
    std::vector<std::size_t> chain;
    for (int a = static_cast<int>(i); a >= 0; a = kParent[a]) chain.insert(chain.begin(), static_cast<std::size_t>(a));
    const std::size_t n = chain.size();
    std::vector<float> cq(n * row), ck(n * kv_row), cv(n * kv_row), cout(n * row);
    for (std::size_t j = 0; j < n; ++j) {
      std::memcpy(&cq[j * row], &q_raw[chain[j] * row], row * sizeof(float));
      std::memcpy(&ck[j * kv_row], &k[chain[j] * kv_row], kv_row * sizeof(float));
      std::memcpy(&cv[j * kv_row], &v[chain[j] * kv_row], kv_row * sizeof(float));
    }
    const std::int32_t chain_table[kStride] = {0, 1, 2, 12};
    const std::int64_t chain_starts[2] = {0, static_cast<std::int64_t>(n)};
    const std::int64_t chain_length = static_cast<std::int64_t>(kCached + n);
    ra::Plan plain;
    ra::plan(plain, shape, ra::Batch{chain_starts, &chain_length, chain_table, kStride, 1});
    ra::append(plain, cache, view(cq, n, kQHeads), view(ck, n, kKvHeads), view(cv, n, kKvHeads), view(cq, n, kQHeads),
               options);
    ra::attend(plain, cache, view(cq, n, kQHeads), view(cout, n, kQHeads));
    const bool same = std::memcmp(&cout[(n - 1) * row], &out[i * row], row * sizeof(float)) == 0;
    std::printf("draft %zu (depth %d, position %lld): %s the plain chain's last row\n", i, depths[i],
                static_cast<long long>(plan.position(i)), same ? "the bytes of" : "DIFFERS from");
    ok = ok && same;
  }
  if (!ok) {
    std::printf("FAILED\n");
    return 1;
  }
  return 0;
}
