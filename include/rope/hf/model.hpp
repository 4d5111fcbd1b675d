// rope/hf/model.hpp — what rope::hf gives for a checkpoint: the RoPE of each
// kind of layer (LayerRope), of the model (ModelRope, with its softmax and
// query scales) and the options of a read (ParseOptions). Data and the
// checks of their accessors only; no JSON.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "../detail/fail.hpp"
#include "../frequencies.hpp"
#include "../pair_axes.hpp"
#include "../style.hpp"

namespace rope::hf {

// A position-dependent factor some families multiply the query by (which is
// the same as multiplying the attention scores of that query):
//   s(m) = 1 + scale * ln(1 + floor((m + offset) / length)),  m = position id.
// Mistral's llama_4_scaling_beta: scale = beta, length = the rope entry's
// original_max_position_embeddings, offset 0, every layer. Llama 4's
// attention temperature tuning: scale = attn_scale, length = floor_scale,
// offset 1, NoPE layers only. scale = 0: no temperature (s = 1).
struct QueryTemperature {
  double scale = 0.0;
  double length = 1.0;
  std::int64_t offset = 0;
  bool nope_layers_only = false;

  double operator()(std::int64_t position) const {
    if (scale == 0.0) return 1.0;
    const double buckets = std::floor(static_cast<double>(position + offset) / length);
    return 1.0 + scale * std::log(1.0 + buckets);
  }
};

// Whether a kind's frequencies depend on the sequence length, and the length
// they switch at: dynamic NTK stretches its base once seq_len passes
// switch_length (max_position_embeddings); longrope takes long_factor once
// seq_len passes switch_length (original_max_position_embeddings). Every
// other rope type (and a NoPE kind) depends on nothing: switch_length 0.
struct SeqLenDependence {
  bool depends = false;
  std::size_t switch_length = 0;
};

// The RoPE of one kind of layer (a model has one kind, or one per layer type).
struct LayerRope {
  std::string layer_type;          // its name in layer_types ("full_attention", ...), "" when the config has none
  bool rotates = true;             // false: a NoPE layer (or a linear-attention / Mamba mixer): no rotation at all
  std::size_t head_dim = 0;        // channels of the head the rotary part lies in
  std::size_t rotary_dim = 0;      // channels rotated: rotary_dim / 2 pairs
  double base = 10000.0;           // theta of the schedule base^(-2p/rotary_dim)
  std::string rope_type = "none";  // "default", "linear", "yarn", ... (legacy names mapped); "none" when !rotates
  Scaling scaling;
  // How this kind's q/k heads are laid out and scored (the model's values
  // for every kind today; per kind because a hybrid or multimodal model may
  // differ): the pairing, the first rotary channel, the M-RoPE axis of each
  // pair and the factor on q.k (ModelRope::softmax_scale).
  Style style = Style::rotate_half;
  std::size_t rotary_offset = 0;
  std::optional<PairAxes> mrope;
  double softmax_scale = 0.0;

  // inv_freq and attention factor at the current sequence length (number of
  // positions: largest position + 1; read by dynamic and longrope only).
  Frequencies frequencies(std::size_t seq_len = 0) const {
    if (!rotates) detail::fail("rope::hf::LayerRope::frequencies", "layer", "a layer that applies RoPE", layer_type);
    return rope::frequencies(rotary_dim, base, scaling, seq_len);
  }

  // Whether frequencies(seq_len) changes with seq_len, and where.
  SeqLenDependence seq_len_dependence() const {
    if (!rotates) return {};
    if (const auto* d = std::get_if<scaling::DynamicNtk>(&scaling)) return {true, d->original_max_positions};
    if (const auto* l = std::get_if<scaling::LongRope>(&scaling)) return {true, l->original_max_positions};
    return {};
  }
};

// The indexer of a sparse MLA layer (DeepSeek Sparse Attention: DeepSeek-V3.2,
// GLM-5): its own small q/k heads score the keys, and the attention keeps
// the index_topk best. Its q and k rotate with the MLA rope part's
// frequencies (ModelRope::frequencies), on the first rotary_dim channels of
// an index_head_dim head, paired as style says (which is the MLA rope part's
// pairing for GLM-5, not for DeepSeek-V3.2). A token's index score is
// sum over heads h of w_h * weight_scale * relu(score_scale * q_h.k), w_h
// from the indexer's own weights projection.
struct MlaIndexer {
  std::size_t topk = 0;      // index_topk: keys kept per query
  std::size_t head_dim = 0;  // index_head_dim
  std::size_t n_heads = 0;   // index_n_heads
  Style style = Style::rotate_half;
  std::size_t rotary_offset = 0;  // first rotated channel of an indexer head: the rope part comes first
  std::size_t rotary_dim = 0;     // qk_rope_head_dim
  double score_scale = 0.0;       // 1 / sqrt(index_head_dim), on q.k before the relu
  double weight_scale = 0.0;      // 1 / sqrt(index_n_heads), on the per-head weights
};

// What a multi-head latent attention (MLA) layer needs beyond its RoPE
// (DeepSeek-V2/V3/V3.2, Kimi K2, GLM-4.7-Flash, GLM-5): the latent ranks
// and the q/k/v head sizes. A q/k head is qk_nope_head_dim unrotated
// channels, then qk_rope_head_dim rotated ones (ModelRope::rotary_offset,
// rotary_dim, style); k's rope part is one head shared by all heads.
struct Mla {
  std::size_t kv_lora_rank = 0;            // the compressed kv latent's width
  std::optional<std::size_t> q_lora_rank;  // the q latent's width; empty: q is projected directly
  std::size_t qk_nope_head_dim = 0;
  std::size_t qk_rope_head_dim = 0;
  std::size_t v_head_dim = 0;
  // YaRN's g(factor, mscale_all_dim) (1 without a scaled rope entry or
  // mscale_all_dim); softmax_scale = mscale^2 / sqrt(qk_nope + qk_rope head
  // dims), the factor on q.k (ModelRope::softmax_scale).
  double mscale = 1.0;
  double softmax_scale = 0.0;
  Style style = Style::block_diagonal;  // the rope part's pairing (ModelRope::style)
  std::optional<MlaIndexer> indexer;    // sparse layers only (DeepSeek-V3.2, GLM-5)
};

// A model's RoPE as its config.json defines it.
struct ModelRope {
  std::string model_type;  // of the text model (text_config.model_type when nested)
  Style style = Style::rotate_half;
  bool style_known = false;  // the config was read as a family of docs/hf_config.md, whose pairing
                             // is known; false when read generically (ParseOptions::generic)
  std::string family;        // the family table row read: model_type, or what architectures or
                             // ParseOptions::family mapped it to; "" when read generically
  // What a generic read (ParseOptions::generic) guessed instead of knowing:
  // "style", "layers" (every layer rotates alike), "rotary_offset" (0),
  // "head_dim", "softmax_scale". Empty for a known family.
  std::vector<std::string> guessed;
  // The main kind of layer (full attention, or the only kind), copied from
  // kinds[0] for convenience.
  std::size_t head_dim = 0;
  std::size_t rotary_dim = 0;
  double base = 10000.0;
  std::string rope_type;
  Scaling scaling;
  // First channel of the rotary part in a q/k head: DeepSeek's q_pe and k_pe
  // follow qk_nope_head_dim channels that are not rotated; 0 elsewhere.
  std::size_t rotary_offset = 0;
  std::size_t max_position_embeddings = 0;  // 0 when the config gives none
  std::size_t num_layers = 0;               // 0 when the config gives none (every layer is then kinds[0])
  std::vector<LayerRope> kinds;             // kinds[0] rotates whenever any kind does
  std::vector<std::size_t> layer_kind;      // kind of each layer; empty: every layer is kinds[0]
  // M-RoPE: the position axis of each pair of kinds[0] (positions rows t, h, w).
  std::optional<PairAxes> mrope;
  // Attention scores are q.k * softmax_scale, as the family's attention
  // computes them: 1/sqrt(qk_head_dim) (DeepSeek: qk_nope + qk_rope head
  // dims), 1/sqrt(query_pre_attn_scalar) for Gemma 2/3, 1 for Gemma 4 (its
  // q and k are RMS-normalised), times score_scale: what RoPE scaling adds to
  // it, DeepSeek's g(factor, mscale_all_dim)^2 with yarn, 1 elsewhere.
  double softmax_scale = 0.0;
  double score_scale = 1.0;
  std::size_t qk_head_dim = 0;
  std::optional<double> query_pre_attn_scalar;
  QueryTemperature temperature;
  // The MLA layer's latent ranks, head sizes and indexer; empty for a
  // model without MLA.
  std::optional<Mla> mla;

  const LayerRope& layer(std::size_t layer_index) const {
    check_layer(layer_index);
    return layer_kind.empty() ? kinds.front() : kinds[layer_kind[layer_index]];
  }
  bool rotates(std::size_t layer_index) const { return layer(layer_index).rotates; }
  // Whether a layer's frequencies depend on the sequence length (dynamic,
  // longrope) and the length they switch at.
  SeqLenDependence seq_len_dependence(std::size_t layer_index = 0) const {
    return layer(layer_index).seq_len_dependence();
  }

  // theta_p and the attention factor of a layer at the current sequence
  // length (number of positions; dynamic and longrope depend on it). Throws
  // for a layer past num_layers and for a NoPE layer.
  Frequencies frequencies(std::size_t layer_index = 0, std::size_t seq_len = 0) const {
    const LayerRope& kind = layer(layer_index);
    if (!kind.rotates) {
      detail::fail("rope::hf::ModelRope::frequencies", "layer",
                   "a layer that applies RoPE (layer " + detail::to_text(layer_index) + " is a NoPE layer" +
                       (kind.layer_type.empty() ? std::string() : " of type " + kind.layer_type) + ")",
                   layer_index);
    }
    return rope::frequencies(kind.rotary_dim, kind.base, kind.scaling, seq_len);
  }

  // The factor on the query of a token at `position` in a layer (1 unless
  // the family defines a temperature for that layer).
  double query_scale(std::size_t layer_index, std::int64_t position) const {
    if (temperature.nope_layers_only && rotates(layer_index)) return 1.0;
    check_layer(layer_index);
    return temperature(position);
  }

 private:
  void check_layer(std::size_t layer_index) const {
    if (num_layers != 0 && layer_index >= num_layers) {
      detail::fail("rope::hf::ModelRope", "layer", {"< num_layers = ", num_layers}, layer_index);
    }
  }
};

// A model_type rope has no family for is refused unless one of these says
// how to read it.
struct ParseOptions {
  // The pairing to use instead of the family's (a remote-code model whose
  // modeling file differs, or with `generic`, the pairing being asserted).
  std::optional<Style> style;
  // Read the config as this family of docs/hf_config.md (a model_type of
  // the table, e.g. "deepseek_v3" for a derivative under its own type name).
  std::optional<std::string> family;
  // Read an unknown model_type as a plain decoder: every layer rotates with
  // the one rope entry, rotary channels from channel 0, softmax scale
  // 1/sqrt(head_dim), pairing rotate_half unless `style` names it.
  // ModelRope::guessed lists what was assumed. Configs with an MLA layout
  // (qk_rope_head_dim) or layer_types are refused even so.
  bool generic = false;
};

}  // namespace rope::hf
