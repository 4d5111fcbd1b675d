// The config-reader program the consumer projects build against
// rope::hf_config: it fails (exit 1) unless a gpt-oss style config.json reads
// as YaRN (attention factor 0.1 ln 32 + 1, the fastest pair untouched, the
// slowest divided by the factor) and its frequencies rotate a query through
// rope::apply by position * theta_p, scaled by the attention factor.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <rope/apply.hpp>
#include <rope/hf_config.hpp>
#include <rope/version.hpp>

int main() {
  const rope::hf::ModelRope m = rope::hf::parse(R"({
    "model_type": "gpt_oss", "head_dim": 64, "hidden_size": 2880, "num_attention_heads": 64,
    "num_hidden_layers": 24, "max_position_embeddings": 131072, "rope_theta": 150000,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": false}})");
  const rope::Frequencies f = m.frequencies();
  const double attention = 0.1 * std::log(32.0) + 1.0;
  const double slowest = std::pow(150000.0, -62.0 / 64.0) / 32.0;
  bool ok = m.style == rope::Style::rotate_half && m.rotary_dim == 64 && f.inv_freq.size() == 32 &&
            std::fabs(f.attention_factor - attention) < 1e-15 && f.inv_freq[0] == 1.0 &&
            std::fabs(f.inv_freq[31] - slowest) < 1e-15 * slowest;

  // One head of one token at position 1000: pair 0 (channels 0 and 32) turns
  // by 1000 radians.
  const std::int64_t position = 1000;
  const rope::Table<double> table(f, position + 1);
  std::vector<double> q(64, 0.0);
  q[0] = 1.0;
  rope::apply(rope::View<double>::token_major(q.data(), 1, 1, 64), table, m.style, &position);
  ok = ok && std::fabs(q[0] - attention * std::cos(1000.0)) < 1e-12 &&
       std::fabs(q[32] - attention * std::sin(1000.0)) < 1e-12;
  std::printf("rope %d hf_config: %s yarn, attention factor %.6f, pair 0 at %lld -> (%.6f, %.6f): %s\n", rope::kVersion,
              m.model_type.c_str(), f.attention_factor, static_cast<long long>(position), q[0], q[32],
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
