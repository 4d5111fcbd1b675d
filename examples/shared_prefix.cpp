// Requests that share a system prompt, decoded with cascade attention: the
// prompt is prefilled once into pages; each request's block table lists the
// prompt's full pages, then pages of its own (the prompt's last, partial
// page copied into its first own page, as an engine forks a sequence).
// Each request prefills its own message, then all decode together. With
// Shape::cascade the plan finds the shared pages and each decode step
// reads them once for every request (rope/attention/cascade.hpp); here
// one group of requests shares a few-shot block after the prompt as well,
// so the plan finds two levels.
//
// Checked: every decode step's output rows against the same step planned
// without cascade. Exits 1 unless they agree within 1e-5 of the largest
// value row: the two add the same products in different orders (the bound
// is docs/attention.md's "Cascade" one), nothing else differs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

namespace {

constexpr std::size_t kQHeads = 8, kKvHeads = 2, kDim = 64, kPageSize = 16, kPoolPages = 64, kStride = 16;
constexpr std::size_t kRequests = 6, kFewShotGroup = 3, kSteps = 4;
constexpr std::size_t kPrompt = 100, kFewShot = 70;  // tokens
constexpr std::size_t kPages = 13;                   // a request's pages: 204 tokens at most
constexpr double kBase = 500000.0;

struct Model {
  std::mt19937 gen{7};
  std::normal_distribution<float> normal;
  // Random Q, K and V rows for n new tokens (a layer's projections).
  void rows(std::size_t n, std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) {
    q.resize(n * kQHeads * kDim);
    k.resize(n * kKvHeads * kDim);
    v.resize(k.size());
    for (auto* x : {&q, &k, &v}) {
      for (float& y : *x) y = normal(gen);
    }
  }
};

}  // namespace

int main() {
  std::vector<rope::BFloat16> k_pool(kPoolPages * kPageSize * kKvHeads * kDim), v_pool(k_pool.size());
  ra::PagedCache<rope::BFloat16> cache{
      ra::PagePool<rope::BFloat16>::nhd(k_pool.data(), kPoolPages, kPageSize, kKvHeads, kDim),
      ra::PagePool<rope::BFloat16>::nhd(v_pool.data(), kPoolPages, kPageSize, kKvHeads, kDim)};
  const rope::Table<float> table(rope::frequencies(kDim, kBase), 1024);
  ra::AppendOptions options;
  options.rotation = {&table, rope::Style::rotate_half};
  Model model;
  std::vector<float> q, k, v;
  std::int32_t next_page = 0;
  ra::Plan plan;

  // Appends n new tokens to each listed request (lengths grown by n), one
  // batch: Q, K, V rotated and written (a prefill's attention is not
  // what this example checks).
  const auto prefill = [&](std::vector<std::int64_t>& lengths, std::vector<std::int32_t>& tables,
                           const std::vector<std::size_t>& who, std::size_t n) {
    std::vector<std::int64_t> starts{0}, lens;
    std::vector<std::int32_t> rows;
    for (const std::size_t b : who) {
      lengths[b] += static_cast<std::int64_t>(n);
      starts.push_back(starts.back() + static_cast<std::int64_t>(n));
      lens.push_back(lengths[b]);
      rows.insert(rows.end(), tables.begin() + static_cast<std::ptrdiff_t>(b * kStride),
                  tables.begin() + static_cast<std::ptrdiff_t>((b + 1) * kStride));
    }
    ra::plan(plan, ra::Shape::of(cache, kQHeads),
             ra::Batch{starts.data(), lens.data(), rows.data(), kStride, who.size()});
    model.rows(plan.tokens(), q, k, v);
    const auto qv = rope::View<float>::token_major(q.data(), plan.tokens(), kQHeads, kDim);
    ra::append(plan, cache, qv, rope::View<const float>::token_major(k.data(), plan.tokens(), kKvHeads, kDim),
               rope::View<const float>::token_major(v.data(), plan.tokens(), kKvHeads, kDim), qv, options);
  };
  // Pages are handed out as the sequences grow.
  const auto give_pages = [&](std::vector<std::int32_t>& tables, std::size_t b, std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) tables[b * kStride + i] = next_page++;
  };
  // Request b's first own page starts as a copy of page `src` (the partial
  // page it forks from).
  const auto fork_page = [&](std::int32_t src, std::int32_t dst) {
    for (auto* pool : {&cache.k, &cache.v}) {
      std::copy_n(pool->data + static_cast<std::size_t>(src) * pool->page_stride, pool->page_stride,
                  pool->data + static_cast<std::size_t>(dst) * pool->page_stride);
    }
  };

  // The system prompt, as sequence "0" of a one-row table, then every
  // request listing its full pages.
  std::vector<std::int64_t> lengths(kRequests + 1, 0);
  std::vector<std::int32_t> tables((kRequests + 1) * kStride, 0);
  const std::size_t prompt_row = kRequests;
  give_pages(tables, prompt_row, 0, (kPrompt + kPageSize - 1) / kPageSize);
  prefill(lengths, tables, {prompt_row}, kPrompt);
  // The few-shot block: the first kFewShotGroup requests share it too,
  // forked from request 0 once it holds it.
  const std::size_t full = kPrompt / kPageSize;
  for (std::size_t b = 0; b < kRequests; ++b) {
    std::copy_n(tables.begin() + static_cast<std::ptrdiff_t>(prompt_row * kStride), full,
                tables.begin() + static_cast<std::ptrdiff_t>(b * kStride));
    lengths[b] = static_cast<std::int64_t>(kPrompt);
    if (b > 0 && b < kFewShotGroup) continue;  // forked from request 0 below
    give_pages(tables, b, full, kPages);
    fork_page(tables[prompt_row * kStride + full], tables[b * kStride + full]);
  }
  prefill(lengths, tables, {0}, kFewShot);
  const std::size_t shot_full = (kPrompt + kFewShot) / kPageSize;
  for (std::size_t b = 1; b < kFewShotGroup; ++b) {
    std::copy_n(tables.begin(), shot_full, tables.begin() + static_cast<std::ptrdiff_t>(b * kStride));
    lengths[b] = lengths[0];
    give_pages(tables, b, shot_full, kPages);
    fork_page(tables[shot_full], tables[b * kStride + shot_full]);
  }
  for (std::size_t b = kFewShotGroup; b < kRequests; ++b) prefill(lengths, tables, {b}, kFewShot / 2);
  // Each request's own message: lengths 5 .. 30.
  for (std::size_t b = 0; b < kRequests; ++b) prefill(lengths, tables, {b}, 5 + 5 * b);

  // Decode steps: every request one token, planned with and without cascade.
  std::vector<std::size_t> all(kRequests);
  std::iota(all.begin(), all.end(), std::size_t{0});
  ra::Plan plain;
  std::vector<float> out(kRequests * kQHeads * kDim), want(out.size());
  double worst = 0;
  bool ok = true;
  for (std::size_t step = 0; step < kSteps; ++step) {
    std::vector<std::int64_t> starts(kRequests + 1);
    std::iota(starts.begin(), starts.end(), std::int64_t{0});
    for (std::size_t b = 0; b < kRequests; ++b) ++lengths[b];
    const std::vector<std::int64_t> lens(lengths.begin(), lengths.begin() + kRequests);
    const ra::Batch batch{starts.data(), lens.data(), tables.data(), kStride, kRequests};
    ra::Shape shape = ra::Shape::of(cache, kQHeads);
    shape.cascade = true;
    ra::plan(plan, shape, batch);
    shape.cascade = false;
    ra::plan(plain, shape, batch);
    model.rows(kRequests, q, k, v);
    const auto qv = rope::View<float>::token_major(q.data(), kRequests, kQHeads, kDim);
    ra::append(plan, cache, qv, rope::View<const float>::token_major(k.data(), kRequests, kKvHeads, kDim),
               rope::View<const float>::token_major(v.data(), kRequests, kKvHeads, kDim), qv, options);
    ra::attend(plan, cache, qv, rope::View<float>::token_major(out.data(), kRequests, kQHeads, kDim));
    ra::attend(plain, cache, qv, rope::View<float>::token_major(want.data(), kRequests, kQHeads, kDim));
    float largest = 0;  // the largest value a row may weigh
    for (const rope::BFloat16 x : v_pool) largest = std::max(largest, std::fabs(static_cast<float>(x)));
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double error = std::fabs(static_cast<double>(out[i]) - want[i]) / largest;
      worst = std::max(worst, error);
      ok = ok && error <= 1e-5;
    }
  }
  const ra::detail::WorkLayout* levels = ra::detail::PlanAccess::cascade(plan);
  std::printf("%zu requests, %zu levels of shared pages; cascade against plain over %zu steps: %.2e of max|v|\n",
              kRequests, levels != nullptr ? levels->cascade.levels.size() : std::size_t{0}, kSteps, worst);
  if (levels == nullptr || levels->cascade.levels.size() != 2) {
    std::printf("FAILED: the plan should find the prompt and the few-shot block\n");
    return 1;
  }
  if (!ok) {
    std::printf("FAILED: the cascade rows are not the plain rows within 1e-5\n");
    return 1;
  }
  return 0;
}
