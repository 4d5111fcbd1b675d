// One DeepSeek-shaped attention layer on rope, multi-head latent attention
// (MLA) with random weights, scaled down: 16 heads, kv_lora_rank 128,
// qk_nope_head_dim 64, qk_rope_head_dim 32 (interleaved pairs), v_head_dim
// 64. Three sequences over a paged bf16 latent cache: a prompt each (in one
// step), then decode steps.
//
// Per step, the layer does what an engine does around rope:
//   - the projections (here random rows): c_kv (the kv_a projection's latent
//     part), k_pe (its rope part), q_nope and q_pe per head;
//   - the step before attention, one rope call: c_kv normalized
//     (kv_a_layernorm), k_pe rotated, the row [c_kv | k_pe] rounded once into
//     the planned bf16 slot, q_pe rotated;
//   - the absorption: q_lat_h = W_UK_h^T q_nope_h (the engine's matmul);
//   - rope's absorbed attention over the latent cache, out_lat_h;
//   - out_h = W_UV_h out_lat_h (the engine's matmul).
// Checked against the unabsorbed MLA written here from the math in double:
// per head k_h = [W_UK_h c_kv_j | k_pe_j], v_h = W_UV_h c_kv_j, the softmax of
// scale * q_h . k_h. Exits 1 unless every output agrees within 1e-5 (relative
// to the largest) when both read the stored bf16 rows: what is left is float
// rounding and the order of summation. It also prints the difference
// against the unrounded rows (bf16's rounding, bounded in docs/attention.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

namespace {

constexpr std::size_t kHeads = 16, kLatent = 128, kNope = 64, kRope = 32, kV = 64, kWidth = kLatent + kRope;
constexpr std::size_t kPage = 16, kPages = 24, kMaxPages = 8;
constexpr double kBase = 10000.0, kEps = 1e-6;

using Rows = std::vector<std::vector<double>>;

// x (kRope values) rotated at position m, pairs (2i, 2i + 1), in double.
std::vector<double> rotate(const std::vector<double>& x, double m) {
  std::vector<double> y(x);
  for (std::size_t i = 0; i < kRope / 2; ++i) {
    const double a = m * std::pow(kBase, -2.0 * double(i) / double(kRope));
    y[2 * i] = x[2 * i] * std::cos(a) - x[2 * i + 1] * std::sin(a);
    y[2 * i + 1] = x[2 * i + 1] * std::cos(a) + x[2 * i] * std::sin(a);
  }
  return y;
}

// The unabsorbed MLA of one head over keys 0 .. position: k = [W_UK c | k_pe],
// v = W_UV c, in double.
std::vector<double> unabsorbed(const std::vector<double>& q_nope, const std::vector<double>& q_pe, const Rows& c,
                               const Rows& k_pe, std::size_t position, const std::vector<double>& w_uk,
                               const std::vector<double>& w_uv, double scale) {
  std::vector<double> s(position + 1), out(kV, 0.0);
  double top = -INFINITY, den = 0;
  for (std::size_t j = 0; j <= position; ++j) {
    double dot = 0;
    for (std::size_t n = 0; n < kNope; ++n) {
      double k_nope = 0;
      for (std::size_t x = 0; x < kLatent; ++x) k_nope += w_uk[n * kLatent + x] * c[j][x];
      dot += q_nope[n] * k_nope;
    }
    for (std::size_t x = 0; x < kRope; ++x) dot += q_pe[x] * k_pe[j][x];
    s[j] = scale * dot;
    top = std::max(top, s[j]);
  }
  for (std::size_t j = 0; j <= position; ++j) {
    const double w = std::exp(s[j] - top);
    den += w;
    for (std::size_t v = 0; v < kV; ++v) {
      double value = 0;
      for (std::size_t x = 0; x < kLatent; ++x) value += w_uv[v * kLatent + x] * c[j][x];
      out[v] += w * value;
    }
  }
  for (double& x : out) x /= den;
  return out;
}

}  // namespace

int main() {
  std::mt19937 gen(17);
  std::normal_distribution<float> normal;
  // The layer's weights: kv_a_layernorm, and per head W_UK [nope x latent],
  // W_UV [v x latent].
  std::vector<float> norm_weight(kLatent);
  for (float& w : norm_weight) w = 1.0f + 0.1f * normal(gen);
  std::vector<std::vector<double>> w_uk(kHeads, std::vector<double>(kNope * kLatent)), w_uv = w_uk;
  for (auto& w : w_uk) std::generate(w.begin(), w.end(), [&] { return normal(gen) / std::sqrt(double(kLatent)); });
  for (auto& w : w_uv) {
    w.resize(kV * kLatent);
    std::generate(w.begin(), w.end(), [&] { return normal(gen) / std::sqrt(double(kLatent)); });
  }
  const double scale = 1.0 / std::sqrt(double(kNope + kRope));

  std::vector<rope::BFloat16> rows(kPages * kPage * kWidth);
  const auto cache = ra::LatentCache<rope::BFloat16>::dense(rows.data(), kPages, kPage, kLatent, kRope);
  const rope::Table<float> table(rope::frequencies(kRope, kBase), 1024);
  ra::AppendOptions append;
  append.rotation = {&table, rope::Style::block_diagonal};  // DeepSeek's pairs (2i, 2i + 1)
  append.k_norm = {norm_weight.data(), kLatent};
  append.eps = kEps;
  ra::Logits logits;
  logits.scale = scale;

  const std::vector<std::size_t> prompts = {9, 23, 4};
  constexpr std::size_t steps = 6;
  const std::size_t sequences = prompts.size();
  std::vector<std::int32_t> free_pages(kPages), block_table(sequences * kMaxPages, -1);
  for (std::size_t i = 0; i < kPages; ++i) free_pages[i] = static_cast<std::int32_t>((i * 7) % kPages);
  std::vector<std::size_t> held(sequences, 0);
  std::vector<std::int64_t> lengths(sequences, 0), q_starts(sequences + 1, 0);
  std::vector<Rows> c_exact(sequences), k_pe_exact(sequences);  // unrounded, what the cache should hold
  ra::Plan plan;
  double worst_stored = 0, worst_exact = 0;
  for (std::size_t step = 0; step <= steps; ++step) {
    std::size_t tokens = 0;
    for (std::size_t b = 0; b < sequences; ++b) {
      const std::size_t n = step == 0 ? prompts[b] : 1;
      q_starts[b + 1] = q_starts[b] + static_cast<std::int64_t>(n);
      lengths[b] += static_cast<std::int64_t>(n);
      tokens += n;
      while (held[b] * kPage < static_cast<std::size_t>(lengths[b])) {
        block_table[b * kMaxPages + held[b]++] = free_pages.front();
        free_pages.erase(free_pages.begin());
      }
    }
    ra::plan(plan, ra::Shape::of(cache, kHeads),
             {q_starts.data(), lengths.data(), block_table.data(), kMaxPages, sequences}, 2);
    // The projections' rows, then the step before attention.
    std::vector<float> c(tokens * kLatent), k_pe(tokens * kRope), q_nope(tokens * kHeads * kNope);
    std::vector<float> q_pe(tokens * kHeads * kRope), q_lat(tokens * kHeads * kLatent), out(q_lat.size());
    for (auto* x : {&c, &k_pe, &q_nope, &q_pe}) std::generate(x->begin(), x->end(), [&] { return normal(gen); });
    const std::vector<float> q_pe_given = q_pe;
    const auto q_pe_view = rope::View<float>::token_major(q_pe.data(), tokens, kHeads, kRope);
    ra::append(plan, cache, rope::View<const float>::token_major(c.data(), tokens, 1, kLatent),
               rope::View<const float>::token_major(k_pe.data(), tokens, 1, kRope), q_pe_view, q_pe_view, append);
    // The absorption, then rope's attention.
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t h = 0; h < kHeads; ++h) {
        for (std::size_t x = 0; x < kLatent; ++x) {
          double s = 0;
          for (std::size_t n = 0; n < kNope; ++n) s += w_uk[h][n * kLatent + x] * q_nope[(t * kHeads + h) * kNope + n];
          q_lat[(t * kHeads + h) * kLatent + x] = static_cast<float>(s);
        }
      }
    }
    ra::attend(plan, cache, rope::View<const float>::token_major(q_lat.data(), tokens, kHeads, kLatent), q_pe_view,
               rope::View<float>::token_major(out.data(), tokens, kHeads, kLatent), logits);

    for (std::size_t t = 0; t < tokens; ++t) {
      std::size_t b = 0;
      while (static_cast<std::int64_t>(t) >= q_starts[b + 1]) ++b;
      const std::int64_t n = q_starts[b + 1] - q_starts[b];
      const auto position = static_cast<std::size_t>(lengths[b] - n + (static_cast<std::int64_t>(t) - q_starts[b]));
      // What the row should hold, unrounded: RMSNorm(c) w | rotated k_pe.
      double ss = 0;
      for (std::size_t x = 0; x < kLatent; ++x) ss += double(c[t * kLatent + x]) * c[t * kLatent + x];
      const double r = 1.0 / std::sqrt(ss / kLatent + kEps);
      std::vector<double> cn(kLatent), kp(k_pe.begin() + t * kRope, k_pe.begin() + (t + 1) * kRope);
      for (std::size_t x = 0; x < kLatent; ++x) cn[x] = c[t * kLatent + x] * r * norm_weight[x];
      c_exact[b].push_back(cn);
      k_pe_exact[b].push_back(rotate(kp, double(position)));
    }
    for (std::size_t t = 0; t < tokens; ++t) {
      std::size_t b = 0;
      while (static_cast<std::int64_t>(t) >= q_starts[b + 1]) ++b;
      const std::int64_t n = q_starts[b + 1] - q_starts[b];
      const auto position = static_cast<std::size_t>(lengths[b] - n + (static_cast<std::int64_t>(t) - q_starts[b]));
      Rows c_stored(position + 1, std::vector<double>(kLatent)), k_stored(position + 1, std::vector<double>(kRope));
      for (std::size_t j = 0; j <= position; ++j) {
        const std::size_t slot = static_cast<std::size_t>(block_table[b * kMaxPages + j / kPage]) * kPage + j % kPage;
        for (std::size_t x = 0; x < kWidth; ++x) {
          const double value = static_cast<float>(cache.row(slot)[x]);
          (x < kLatent ? c_stored[j][x] : k_stored[j][x - kLatent]) = value;
        }
      }
      for (std::size_t h = 0; h < kHeads; ++h) {
        const std::vector<double> qn(q_nope.begin() + (t * kHeads + h) * kNope,
                                     q_nope.begin() + (t * kHeads + h + 1) * kNope);
        const std::vector<double> qp = rotate(std::vector<double>(q_pe_given.begin() + (t * kHeads + h) * kRope,
                                                                  q_pe_given.begin() + (t * kHeads + h + 1) * kRope),
                                              double(position));
        const auto stored = unabsorbed(qn, qp, c_stored, k_stored, position, w_uk[h], w_uv[h], scale);
        const auto exact = unabsorbed(qn, qp, c_exact[b], k_pe_exact[b], position, w_uk[h], w_uv[h], scale);
        double top = 0;
        for (const double x : stored) top = std::max(top, std::fabs(x));
        for (std::size_t v = 0; v < kV; ++v) {
          double got = 0;  // out_h = W_UV_h out_lat_h
          for (std::size_t x = 0; x < kLatent; ++x)
            got += w_uv[h][v * kLatent + x] * out[(t * kHeads + h) * kLatent + x];
          worst_stored = std::max(worst_stored, std::fabs(got - stored[v]) / top);
          worst_exact = std::max(worst_exact, std::fabs(got - exact[v]) / top);
        }
      }
    }
  }
  std::printf(
      "rope MLA layer: %zu heads, kv_lora_rank %zu, rope %zu, bf16 latent pages of %zu; prompts %zu, %zu, %zu, "
      "%zu decode steps\n",
      kHeads, kLatent, kRope, kPage, prompts[0], prompts[1], prompts[2], steps);
  std::printf("max |absorbed on rope - unabsorbed over the stored rows| / max |output| = %.2e (limit 1e-5)\n",
              worst_stored);
  std::printf("max |absorbed on rope - unabsorbed over the unrounded rows| / max |output| = %.2e (bf16's rounding)\n",
              worst_exact);
  return worst_stored <= 1e-5 ? 0 : 1;
}
