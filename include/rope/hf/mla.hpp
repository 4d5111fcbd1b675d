// rope/hf/mla.hpp — what a multi-head latent attention (MLA) layer needs
// beyond its RoPE (ModelRope::mla): the latent ranks, the q/k/v head sizes,
// the softmax scale with YaRN's mscale_all_dim, the pairing flags the
// implementations agree on, and a sparse layer's indexer (DeepSeek-V3.2,
// GLM-5). Internal to rope::hf.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>

#include "../frequencies.hpp"
#include "families.hpp"
#include "layers.hpp"
#include "model.hpp"
#include "reader.hpp"

namespace rope::hf::detail {

// g(factor, mscale_all_dim) of YaRN (yarn_get_mscale), which MLA attention
// squares into its softmax scale whatever the rope entry's own attention
// factor: DeepseekV2/V3/V32Attention and Glm4MoeLiteAttention read
// rope_parameters["factor"] when the entry's type is not "default" and
// mscale_all_dim is nonzero. A null factor fails there (the reference
// compares None with 1), so rope refuses it. GLM-5's first release left the
// factor out of its softmax scale, the later one squares it in: a config
// that needs it is refused for glm_moe_dsa.
inline double mla_mscale(const Config& config, const Reader& main_entry, const ModelRope& model) {
  if (config.block.json == nullptr || model.kinds[0].rope_type == "default") return 1.0;
  const double all_dim = main_entry.number("mscale_all_dim").value_or(0.0);
  if (all_dim == 0.0) return 1.0;
  if (config.context.family.indexer_interleaved) {
    main_entry.bad("mscale_all_dim",
                   "absent or 0 for glm_moe_dsa (its releases disagree on whether the softmax scale squares "
                   "g(factor, mscale_all_dim) in)",
                   *main_entry.find("mscale_all_dim"));
  }
  if (main_entry.present("factor") && main_entry.object()->at("factor").is_null()) {
    main_entry.bad("factor", "a number > 0 (MLA's softmax scale reads it with mscale_all_dim)", nullptr);
  }
  const double factor = main_entry.required_positive("factor", "MLA's softmax scale reads it with mscale_all_dim");
  return static_cast<double>(rope::detail::yarn_g(factor, all_dim));
}

// A rank or head size of an MLA layer. rope reads them from the config:
// the configuration classes default them per family, which rope does not
// guess for a config that leaves them out.
inline std::size_t mla_size(const Reader& cfg, const char* key) {
  const auto n = cfg.positive_count(key);
  if (!n) cfg.missing(key, "an MLA layer's sizes are read from the config, not from class defaults");
  return *n;
}

// q_lora_rank: null when q is projected directly (DeepSeek-V2-Lite). A
// sparse layer's indexer projects its queries from the q latent (wq_b): it
// needs one.
inline std::optional<std::size_t> q_lora_rank_of(const Reader& cfg, const Family& family) {
  if (!cfg.present("q_lora_rank")) {
    cfg.missing("q_lora_rank", "null for no q compression; an MLA layer's sizes are read from the config");
  }
  if (cfg.object()->at("q_lora_rank").is_null()) {
    if (family.sparse_mla)
      cfg.bad("q_lora_rank", "a whole number > 0 (the indexer projects from the q latent)", nullptr);
    return std::nullopt;
  }
  return cfg.positive_count("q_lora_rank");
}

// The pairing flags of the sparse families, where their implementations
// agree only for some values. GLM-5: the later modeling code interleaves
// the main and the indexer rope whatever the flags say, vLLM interleaves
// the main rope and the indexer only with indexer_rope_interleave true (its
// checkpoints say true for both). DeepSeek-V3.2: its reference and
// transformers rotate the indexer's halves, vLLM interleaves them when
// indexer_rope_interleave is true.
inline void check_sparse_pairing(const Reader& cfg, const Family& family) {
  if (!family.sparse_mla) return;
  if (family.indexer_interleaved) {
    if (cfg.present("rope_interleave") && !cfg.flag("rope_interleave", true)) {
      cfg.bad("rope_interleave", "true or absent (GLM-5's implementations interleave its rope part)",
              cfg.object()->at("rope_interleave"));
    }
    if (!cfg.has("indexer_rope_interleave") || !cfg.flag("indexer_rope_interleave", false)) {
      fail(cfg.fn(), cfg.path("indexer_rope_interleave"),
           "true (GLM-5's indexer interleaves its rope; absent or false, vLLM rotates halves instead)",
           cfg.has("indexer_rope_interleave") ? cfg.find("indexer_rope_interleave")->dump() : std::string("nothing"));
    }
  } else if (cfg.flag("indexer_rope_interleave", false)) {
    cfg.bad("indexer_rope_interleave",
            "absent or false (DeepSeek-V3.2's reference indexer rotates halves; vLLM would interleave)",
            *cfg.find("indexer_rope_interleave"));
  }
}

// A sparse layer's indexer (DeepseekV32Indexer, GlmMoeDsaIndexer): q and k
// split [qk_rope_head_dim, the rest], the rope part rotated with the main
// attention's cos and sin.
inline MlaIndexer read_indexer(const Reader& cfg, const Family& family, std::size_t rope_dim) {
  MlaIndexer x;
  x.topk = mla_size(cfg, "index_topk");
  x.head_dim = mla_size(cfg, "index_head_dim");
  x.n_heads = mla_size(cfg, "index_n_heads");
  if (x.head_dim < rope_dim) {
    cfg.bad("index_head_dim", ">= qk_rope_head_dim = " + to_text(rope_dim) + " (an indexer head holds the rope part)",
            *cfg.find("index_head_dim"));
  }
  x.style = family.indexer_interleaved ? Style::block_diagonal : Style::rotate_half;
  x.rotary_offset = 0;
  x.rotary_dim = rope_dim;
  x.score_scale = 1.0 / std::sqrt(static_cast<double>(x.head_dim));
  x.weight_scale = 1.0 / std::sqrt(static_cast<double>(x.n_heads));
  return x;
}

// The MLA description of a model whose family has MLA (empty otherwise).
// The rope part is rotated whole: apply_rotary_pos_emb_interleave pairs all
// qk_rope_head_dim channels with cos and sin of that width, so a partial
// rotary factor below 1 has no defined result there.
inline void read_mla(const Config& config, const Reader& main_entry, ModelRope& model) {
  const Family& family = config.context.family;
  if (!family.deepseek) return;
  const Reader& cfg = config.cfg();
  Mla m;
  m.qk_nope_head_dim = model.rotary_offset;
  m.qk_rope_head_dim = model.head_dim;
  if (model.rotary_dim != m.qk_rope_head_dim) {
    const std::string key = cfg.has("partial_rotary_factor") || config.block.json == nullptr
                                ? cfg.path("partial_rotary_factor")
                                : config.block.path + ".partial_rotary_factor";
    fail(cfg.fn(), key, {"1 for MLA (its rope part rotates all qk_rope_head_dim = ", m.qk_rope_head_dim, " channels)"},
         "a factor rotating " + to_text(model.rotary_dim) + " channels");
  }
  check_sparse_pairing(cfg, family);
  m.kv_lora_rank = mla_size(cfg, "kv_lora_rank");
  m.q_lora_rank = q_lora_rank_of(cfg, family);
  m.v_head_dim = mla_size(cfg, "v_head_dim");
  m.mscale = mla_mscale(config, main_entry, model);
  m.softmax_scale = model.softmax_scale;
  m.style = model.style;
  if (family.sparse_mla) m.indexer = read_indexer(cfg, family, m.qk_rope_head_dim);
  model.mla = m;
}

}  // namespace rope::hf::detail
