// A small Llama-style decoder on rope, the first thing a model author reads:
// token embedding, then per layer RMSNorm, grouped-query attention (Q and K
// rotated by RoPE, a KV cache), a residual, RMSNorm and a SwiGLU feed-forward
// block with its residual; a last RMSNorm and the output projection to
// logits. The weights are random (written by the program itself, seeded),
// so the tokens mean nothing; the arithmetic is a real decoder's.
//
// The attention runs on rope's serving path over one sequence's contiguous
// f32 cache per layer: each step is planned once (the plan of one
// sequence), and each layer appends (Q and the new key rotated at the
// planned position, K and V written into the cache) and attends. The
// prompt is one step, then one token per step, chosen greedily.
//
// The same model is also computed by a plain float implementation in this
// program (its own angles, its own cache, loops for the attention), fed
// the same tokens. Exits 1 unless every step's logits agree within 1e-4 of
// the largest logit (float rounding in two orders of summation) and the
// greedy tokens agree. Prints tokens per second of both.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

namespace {

constexpr std::size_t kVocab = 512, kDim = 256, kLayers = 4, kQHeads = 8, kKvHeads = 2, kHeadDim = kDim / kQHeads;
constexpr std::size_t kHidden = 688, kMaxTokens = 96, kPrompt = 16;
constexpr double kBase = 10000.0;
constexpr float kEps = 1e-5f;

using Matrix = std::vector<float>;  // row-major [rows, cols]

struct Layer {
  std::vector<float> attention_norm, ffn_norm;
  Matrix wq, wk, wv, wo, w1, w2, w3;
};

struct Weights {
  Matrix embedding, output;
  std::vector<float> final_norm;
  std::vector<Layer> layers;
};

Matrix random_matrix(std::size_t rows, std::size_t cols, std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
  Matrix m(rows * cols);
  for (float& x : m) x = normal(gen);
  return m;
}

Weights random_weights(std::uint32_t seed) {
  std::mt19937 gen(seed);
  Weights w;
  w.embedding = random_matrix(kVocab, kDim, gen);
  w.output = random_matrix(kVocab, kDim, gen);
  w.final_norm.assign(kDim, 1.0f);
  for (std::size_t l = 0; l < kLayers; ++l) {
    Layer layer;
    std::uniform_real_distribution<float> near_one(0.8f, 1.2f);
    for (auto* n : {&layer.attention_norm, &layer.ffn_norm}) {
      n->resize(kDim);
      for (float& x : *n) x = near_one(gen);
    }
    layer.wq = random_matrix(kQHeads * kHeadDim, kDim, gen);
    layer.wk = random_matrix(kKvHeads * kHeadDim, kDim, gen);
    layer.wv = random_matrix(kKvHeads * kHeadDim, kDim, gen);
    layer.wo = random_matrix(kDim, kQHeads * kHeadDim, gen);
    layer.w1 = random_matrix(kHidden, kDim, gen);
    layer.w3 = random_matrix(kHidden, kDim, gen);
    layer.w2 = random_matrix(kDim, kHidden, gen);
    w.layers.push_back(std::move(layer));
  }
  return w;
}

// y = W x for W [rows, cols].
void matvec(const Matrix& w, const float* x, std::size_t rows, std::size_t cols, float* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    float s = 0.0f;
    for (std::size_t c = 0; c < cols; ++c) s += w[r * cols + c] * x[c];
    y[r] = s;
  }
}

void rms_norm(const float* x, const std::vector<float>& w, float* y) {
  float ss = 0.0f;
  for (std::size_t c = 0; c < kDim; ++c) ss += x[c] * x[c];
  const float r = 1.0f / std::sqrt(ss / kDim + kEps);
  for (std::size_t c = 0; c < kDim; ++c) y[c] = x[c] * r * w[c];
}

// The feed-forward block on the normalized row x, added to the residual h.
void swiglu(const Layer& layer, const float* x, float* h) {
  std::vector<float> a(kHidden), b(kHidden), out(kDim);
  matvec(layer.w1, x, kHidden, kDim, a.data());
  matvec(layer.w3, x, kHidden, kDim, b.data());
  for (std::size_t i = 0; i < kHidden; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
  matvec(layer.w2, a.data(), kDim, kHidden, out.data());
  for (std::size_t c = 0; c < kDim; ++c) h[c] += out[c];
}

std::size_t argmax(const std::vector<float>& logits) {
  return static_cast<std::size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The plain implementation: its own angles and cache, loops for attention.
struct Plain {
  const Weights& w;
  std::vector<Matrix> k_cache, v_cache;  // per layer [kMaxTokens, kKvHeads * kHeadDim]
  explicit Plain(const Weights& weights)
      : w(weights),
        k_cache(kLayers, Matrix(kMaxTokens * kKvHeads * kHeadDim)),
        v_cache(kLayers, Matrix(kMaxTokens * kKvHeads * kHeadDim)) {}

  // Pairs (i, i + d/2) of each head rotated by position * base^(-2i/d).
  static void rotate(float* x, std::size_t heads, std::size_t position) {
    for (std::size_t h = 0; h < heads; ++h) {
      float* row = x + h * kHeadDim;
      for (std::size_t i = 0; i < kHeadDim / 2; ++i) {
        const double angle = double(position) * std::pow(kBase, -2.0 * double(i) / double(kHeadDim));
        const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
        const float a = row[i], b = row[i + kHeadDim / 2];
        row[i] = a * c - b * s;
        row[i + kHeadDim / 2] = b * c + a * s;
      }
    }
  }

  // The logits after token `token` at `position`.
  std::vector<float> step(std::size_t token, std::size_t position) {
    std::vector<float> h(w.embedding.begin() + token * kDim, w.embedding.begin() + (token + 1) * kDim);
    std::vector<float> x(kDim), q(kQHeads * kHeadDim), att(kQHeads * kHeadDim), out(kDim);
    for (std::size_t l = 0; l < kLayers; ++l) {
      const Layer& layer = w.layers[l];
      rms_norm(h.data(), layer.attention_norm, x.data());
      float* k = &k_cache[l][position * kKvHeads * kHeadDim];
      float* v = &v_cache[l][position * kKvHeads * kHeadDim];
      matvec(layer.wq, x.data(), kQHeads * kHeadDim, kDim, q.data());
      matvec(layer.wk, x.data(), kKvHeads * kHeadDim, kDim, k);
      matvec(layer.wv, x.data(), kKvHeads * kHeadDim, kDim, v);
      rotate(q.data(), kQHeads, position);
      rotate(k, kKvHeads, position);
      for (std::size_t hq = 0; hq < kQHeads; ++hq) {
        const std::size_t g = hq / (kQHeads / kKvHeads);
        std::vector<float> s(position + 1);
        float top = -INFINITY;
        for (std::size_t j = 0; j <= position; ++j) {
          float dot = 0.0f;
          for (std::size_t c = 0; c < kHeadDim; ++c)
            dot += q[hq * kHeadDim + c] * k_cache[l][(j * kKvHeads + g) * kHeadDim + c];
          s[j] = dot / std::sqrt(static_cast<float>(kHeadDim));
          top = std::max(top, s[j]);
        }
        float den = 0.0f;
        std::fill_n(&att[hq * kHeadDim], kHeadDim, 0.0f);
        for (std::size_t j = 0; j <= position; ++j) {
          const float p = std::exp(s[j] - top);
          den += p;
          for (std::size_t c = 0; c < kHeadDim; ++c)
            att[hq * kHeadDim + c] += p * v_cache[l][(j * kKvHeads + g) * kHeadDim + c];
        }
        for (std::size_t c = 0; c < kHeadDim; ++c) att[hq * kHeadDim + c] /= den;
      }
      matvec(layer.wo, att.data(), kDim, kQHeads * kHeadDim, out.data());
      for (std::size_t c = 0; c < kDim; ++c) h[c] += out[c];
      rms_norm(h.data(), layer.ffn_norm, x.data());
      swiglu(layer, x.data(), h.data());
    }
    rms_norm(h.data(), w.final_norm, x.data());
    std::vector<float> logits(kVocab);
    matvec(w.output, x.data(), kVocab, kDim, logits.data());
    return logits;
  }
};

// The same model with rope's attention: per layer a contiguous cache, per
// step one plan; the rows of a step's tokens batched [tokens, ...].
struct OnRope {
  const Weights& w;
  const rope::Table<float> table{rope::frequencies(kHeadDim, kBase), kMaxTokens};
  std::vector<Matrix> k_cache, v_cache;
  std::vector<ra::PagedCache<float>> caches;
  ra::Plan plan;
  std::size_t cached = 0;

  explicit OnRope(const Weights& weights)
      : w(weights),
        k_cache(kLayers, Matrix(kMaxTokens * kKvHeads * kHeadDim)),
        v_cache(kLayers, Matrix(kMaxTokens * kKvHeads * kHeadDim)) {
    for (std::size_t l = 0; l < kLayers; ++l) {
      caches.push_back(ra::PagedCache<float>::contiguous(
          rope::View<float>::token_major(k_cache[l].data(), kMaxTokens, kKvHeads, kHeadDim),
          rope::View<float>::token_major(v_cache[l].data(), kMaxTokens, kKvHeads, kHeadDim)));
    }
  }

  // The logits after the last of `tokens`, which follow the cached ones.
  std::vector<float> step(const std::vector<std::size_t>& tokens) {
    const std::size_t n = tokens.size();
    ra::plan(plan, ra::Shape::of(caches[0], kQHeads), cached, n);
    ra::AppendOptions append;
    append.rotation = {&table, rope::Style::rotate_half};
    Matrix h(n * kDim), x(kDim), q(n * kQHeads * kHeadDim), k(n * kKvHeads * kHeadDim), v(k.size()), att(q.size());
    std::vector<float> out(kDim);
    for (std::size_t t = 0; t < n; ++t) std::copy_n(&w.embedding[tokens[t] * kDim], kDim, &h[t * kDim]);
    const auto q_view = rope::View<float>::token_major(q.data(), n, kQHeads, kHeadDim);
    for (std::size_t l = 0; l < kLayers; ++l) {
      const Layer& layer = w.layers[l];
      for (std::size_t t = 0; t < n; ++t) {
        rms_norm(&h[t * kDim], layer.attention_norm, x.data());
        matvec(layer.wq, x.data(), kQHeads * kHeadDim, kDim, &q[t * kQHeads * kHeadDim]);
        matvec(layer.wk, x.data(), kKvHeads * kHeadDim, kDim, &k[t * kKvHeads * kHeadDim]);
        matvec(layer.wv, x.data(), kKvHeads * kHeadDim, kDim, &v[t * kKvHeads * kHeadDim]);
      }
      ra::append(plan, caches[l], q_view, rope::View<const float>::token_major(k.data(), n, kKvHeads, kHeadDim),
                 rope::View<const float>::token_major(v.data(), n, kKvHeads, kHeadDim), q_view, append);
      ra::attend(plan, caches[l], q_view, rope::View<float>::token_major(att.data(), n, kQHeads, kHeadDim));
      for (std::size_t t = 0; t < n; ++t) {
        matvec(layer.wo, &att[t * kQHeads * kHeadDim], kDim, kQHeads * kHeadDim, out.data());
        for (std::size_t c = 0; c < kDim; ++c) h[t * kDim + c] += out[c];
        rms_norm(&h[t * kDim], layer.ffn_norm, x.data());
        swiglu(layer, x.data(), &h[t * kDim]);
      }
    }
    cached += n;
    rms_norm(&h[(n - 1) * kDim], w.final_norm, x.data());
    std::vector<float> logits(kVocab);
    matvec(w.output, x.data(), kVocab, kDim, logits.data());
    return logits;
  }
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main() {
  const Weights weights = random_weights(2024);
  std::vector<std::size_t> tokens(kPrompt);
  std::mt19937 gen(7);
  for (std::size_t& t : tokens) t = gen() % kVocab;

  // rope: the prompt in one step, then one token per step.
  OnRope model(weights);
  std::vector<std::vector<float>> rope_logits;
  const auto rope_start = std::chrono::steady_clock::now();
  rope_logits.push_back(model.step(tokens));
  while (tokens.size() < kMaxTokens) {
    tokens.push_back(argmax(rope_logits.back()));
    rope_logits.push_back(model.step({tokens.back()}));
  }
  const double rope_seconds = seconds_since(rope_start);

  // The plain implementation, fed the same tokens one at a time.
  Plain plain(weights);
  double worst = 0;
  bool same_tokens = true;
  const auto plain_start = std::chrono::steady_clock::now();
  std::vector<float> logits;
  for (std::size_t p = 0; p < kMaxTokens; ++p) {
    logits = plain.step(tokens[p], p);
    if (p + 1 < kPrompt) continue;
    const std::vector<float>& got = rope_logits[p + 1 - kPrompt];
    float top = 0.0f;
    for (const float x : logits) top = std::max(top, std::fabs(x));
    for (std::size_t i = 0; i < kVocab; ++i) worst = std::max(worst, double(std::fabs(got[i] - logits[i]) / top));
    if (p + 1 < kMaxTokens) same_tokens = same_tokens && argmax(logits) == tokens[p + 1];
  }
  const double plain_seconds = seconds_since(plain_start);

  const std::size_t generated = kMaxTokens - kPrompt;
  std::printf(
      "rope decoder: %zu layers, %zu/%zu heads of %zu, SwiGLU %zu, vocab %zu; %zu prompt tokens, %zu generated\n",
      kLayers, kQHeads, kKvHeads, kHeadDim, kHidden, kVocab, kPrompt, generated);
  std::printf("tokens/s: %.0f on rope, %.0f plain (the matrix-vector products, the same loops in both, dominate)\n",
              double(kMaxTokens) / rope_seconds, double(kMaxTokens) / plain_seconds);
  std::printf("max |logits on rope - plain logits| / max |plain logit| = %.2e (limit 1e-4); greedy tokens %s\n", worst,
              same_tokens ? "agree" : "DIFFER");
  return worst <= 1e-4 && same_tokens ? 0 : 1;
}
