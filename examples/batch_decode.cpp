// A server's step loop over paged bf16 KV caches, two layers: three
// requests with prompts of different lengths are prefilled in one batch,
// then decoded together, one token per request per step. Each step is
// planned once (rope::attention::plan: positions, slots, work), then each
// layer appends (Q and K rotated at the planned positions, K and V rounded
// once into bf16 in their slots) and attends. Pages are handed out from a
// free list as the sequences grow, so their pages interleave in the pool.
//
// Checked against a plain implementation written here from the math (double
// loops, angles m * base^(-2i/d), no rope call). Exits 1 unless both hold
// on every output row of every layer and step:
//  - rope over the bf16 cache against the plain softmax over the keys and
//    values as stored (read back from the pages): within 1e-5, float
//    rounding only;
//  - rope against the plain softmax over the unrounded keys and values:
//    within the bound rounding K and V once into bf16 allows
//    (docs/attention.md), max|v' - v| + (exp(2 eps) - 1) max|v| with
//    eps = max_j |scale q.(k'_j - k_j)|, plus 1e-5 of float rounding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

namespace {

constexpr std::size_t kQHeads = 8, kKvHeads = 2, kGroup = kQHeads / kKvHeads, kDim = 64, kLayers = 2;
constexpr std::size_t kPageSize = 16, kPoolPages = 12, kMaxPagesPerSequence = 4;
constexpr double kBase = 500000.0;

// x (d values) rotated at position m, rotate_half pairing, in double.
std::vector<double> rotate(const float* x, double m) {
  std::vector<double> y(kDim);
  for (std::size_t i = 0; i < kDim / 2; ++i) {
    const double angle = m * std::pow(kBase, -2.0 * double(i) / double(kDim));
    const double a = x[i], b = x[i + kDim / 2];
    y[i] = a * std::cos(angle) - b * std::sin(angle);
    y[i + kDim / 2] = b * std::cos(angle) + a * std::sin(angle);
  }
  return y;
}

// softmax(scale q . k_j) v over keys 0 .. visible-1 (rows of kDim doubles).
std::vector<double> plain_softmax(const std::vector<double>& q, const std::vector<std::vector<double>>& keys,
                                  const std::vector<std::vector<double>>& values, std::size_t visible) {
  const double scale = 1.0 / std::sqrt(double(kDim));
  std::vector<double> s(visible);
  double top = -INFINITY;
  for (std::size_t j = 0; j < visible; ++j) {
    double dot = 0;
    for (std::size_t c = 0; c < kDim; ++c) dot += q[c] * keys[j][c];
    s[j] = scale * dot;
    top = std::max(top, s[j]);
  }
  std::vector<double> out(kDim, 0.0);
  double den = 0;
  for (std::size_t j = 0; j < visible; ++j) {
    const double w = std::exp(s[j] - top);
    den += w;
    for (std::size_t c = 0; c < kDim; ++c) out[c] += w * values[j][c];
  }
  for (double& x : out) x /= den;
  return out;
}

// One layer's history of one request, as the plain implementation keeps it:
// the keys rotated in double and the values, unrounded.
struct History {
  std::vector<std::vector<double>> k[kKvHeads], v[kKvHeads];
};

}  // namespace

int main() {
  const rope::Table<float> table(rope::frequencies(kDim, kBase), 4096);
  const std::size_t pool_size = kPoolPages * kPageSize * kKvHeads * kDim;
  std::vector<std::vector<rope::BFloat16>> k_pools(kLayers, std::vector<rope::BFloat16>(pool_size));
  std::vector<std::vector<rope::BFloat16>> v_pools = k_pools;
  std::vector<ra::PagedCache<rope::BFloat16>> caches;
  for (std::size_t l = 0; l < kLayers; ++l) {
    caches.push_back({ra::PagePool<rope::BFloat16>::nhd(k_pools[l].data(), kPoolPages, kPageSize, kKvHeads, kDim),
                      ra::PagePool<rope::BFloat16>::nhd(v_pools[l].data(), kPoolPages, kPageSize, kKvHeads, kDim)});
  }
  ra::Shape shape = ra::Shape::of(caches[0], kQHeads);
  shape.kv_split = 16;  // a decode token's keys in parts of 16, merged: the same bytes for any thread count
  ra::AppendOptions append;
  append.rotation = {&table, rope::Style::rotate_half};

  const std::vector<std::size_t> prompts = {5, 19, 33};
  constexpr std::size_t steps = 12;
  const std::size_t sequences = prompts.size();
  std::vector<std::int32_t> free_pages = {7, 2, 9, 0, 5, 11, 3, 8, 1, 10, 6, 4};
  std::vector<std::int32_t> block_table(sequences * kMaxPagesPerSequence, -1);
  std::vector<std::size_t> pages_held(sequences, 0);
  std::vector<std::int64_t> lengths(sequences, 0), q_starts(sequences + 1, 0);
  std::vector<History> history(sequences * kLayers);
  ra::Plan plan;  // kept between steps: nothing allocated once grown

  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  double worst_stored = 0, worst_excess = -1e300, worst_exact = 0;
  bool ok = true;
  for (std::size_t step = 0; step <= steps; ++step) {
    // This step's batch: the whole prompt at step 0, then one token each.
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
    ra::plan(plan, shape, {q_starts.data(), lengths.data(), block_table.data(), kMaxPagesPerSequence, sequences}, 2);

    for (std::size_t layer = 0; layer < kLayers; ++layer) {
      // What this layer's Q, K and V projections give for the step's tokens.
      std::vector<float> q(tokens * kQHeads * kDim), k(tokens * kKvHeads * kDim), v(k.size());
      for (auto* x : {&q, &k, &v}) std::generate(x->begin(), x->end(), [&] { return normal(gen); });
      const std::vector<float> q_given = q;
      const auto qv = rope::View<float>::token_major(q.data(), tokens, kQHeads, kDim);
      ra::append(plan, caches[layer], qv, rope::View<const float>::token_major(k.data(), tokens, kKvHeads, kDim),
                 rope::View<const float>::token_major(v.data(), tokens, kKvHeads, kDim), qv, append);
      std::vector<float> out(tokens * kQHeads * kDim);
      ra::attend(plan, caches[layer], qv, rope::View<float>::token_major(out.data(), tokens, kQHeads, kDim));

      for (std::size_t t = 0; t < tokens; ++t) {
        std::size_t b = 0;
        while (static_cast<std::int64_t>(t) >= q_starts[b + 1]) ++b;
        const std::int64_t n = q_starts[b + 1] - q_starts[b];
        const auto position = static_cast<std::size_t>(lengths[b] - n + (static_cast<std::int64_t>(t) - q_starts[b]));
        History& hist = history[b * kLayers + layer];
        for (std::size_t g = 0; g < kKvHeads; ++g) {
          hist.k[g].push_back(rotate(&k[(t * kKvHeads + g) * kDim], double(position)));
          hist.v[g].push_back(std::vector<double>(&v[(t * kKvHeads + g) * kDim], &v[(t * kKvHeads + g + 1) * kDim]));
        }
      }
      // Every row against the plain softmax, over the stored and the exact
      // keys and values. A token's own key joins its history before it is
      // read: the loop above appended the step's keys in position order.
      const double scale = 1.0 / std::sqrt(double(kDim));
      for (std::size_t t = 0; t < tokens; ++t) {
        std::size_t b = 0;
        while (static_cast<std::int64_t>(t) >= q_starts[b + 1]) ++b;
        const std::int64_t n = q_starts[b + 1] - q_starts[b];
        const auto position = static_cast<std::size_t>(lengths[b] - n + (static_cast<std::int64_t>(t) - q_starts[b]));
        const History& hist = history[b * kLayers + layer];
        const std::int32_t* pages = block_table.data() + b * kMaxPagesPerSequence;
        for (std::size_t h = 0; h < kQHeads; ++h) {
          const std::size_t g = h / kGroup;
          const std::vector<double> qr = rotate(&q_given[(t * kQHeads + h) * kDim], double(position));
          std::vector<std::vector<double>> k_stored(position + 1), v_stored(position + 1);
          double eps = 0, dv_max = 0, v_max = 0;
          for (std::size_t j = 0; j <= position; ++j) {
            const std::size_t slot = static_cast<std::size_t>(pages[j / kPageSize]) * kPageSize + j % kPageSize;
            const rope::BFloat16* kr = caches[layer].k.row(slot, g);
            const rope::BFloat16* vr = caches[layer].v.row(slot, g);
            double dot = 0;
            for (std::size_t c = 0; c < kDim; ++c) {
              k_stored[j].push_back(static_cast<float>(kr[c]));
              v_stored[j].push_back(static_cast<float>(vr[c]));
              dot += qr[c] * (k_stored[j][c] - hist.k[g][j][c]);
              dv_max = std::max(dv_max, std::fabs(v_stored[j][c] - hist.v[g][j][c]));
              v_max = std::max(v_max, std::fabs(hist.v[g][j][c]));
            }
            eps = std::max(eps, std::fabs(scale * dot));
          }
          const std::vector<double> stored = plain_softmax(qr, k_stored, v_stored, position + 1);
          const std::vector<double> exact = plain_softmax(qr, hist.k[g], hist.v[g], position + 1);
          const double bound = dv_max + std::expm1(2 * eps) * v_max;
          for (std::size_t c = 0; c < kDim; ++c) {
            const double got = out[(t * kQHeads + h) * kDim + c];
            worst_stored = std::max(worst_stored, std::fabs(got - stored[c]));
            worst_exact = std::max(worst_exact, std::fabs(got - exact[c]));
            worst_excess = std::max(worst_excess, std::fabs(got - exact[c]) - bound);
            ok = ok && std::fabs(got - stored[c]) <= 1e-5 && std::fabs(got - exact[c]) <= bound + 1e-5;
          }
        }
      }
    }
  }
  std::printf(
      "rope batch decode: %zu requests (prompts %zu, %zu, %zu), %zu decode steps, %zu layers, bf16 pages of %zu\n",
      sequences, prompts[0], prompts[1], prompts[2], steps, kLayers, kPageSize);
  std::printf("max |rope - plain softmax over the stored bf16 rows| = %.2e (limit 1e-5)\n", worst_stored);
  std::printf(
      "max |rope - plain softmax over the exact rows| = %.2e; max excess over the rounding bound = %.2e "
      "(limit 1e-5)\n",
      worst_exact, worst_excess);
  return ok ? 0 : 1;
}
