// rope/hf/read.hpp — a whole config read into a ModelRope. Internal to
// rope::hf; hf_config.hpp holds the entry points.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "families.hpp"
#include "model.hpp"
#include "mrope.hpp"
#include "reader.hpp"
#include "rope_entry.hpp"

namespace rope::hf::detail {

inline ModelRope read(const char* fn, const Json& root, const ParseOptions& options) {
  if (!root.is_object()) fail(fn, "the config", "a JSON object", root.dump());
  const Reader top(fn, &root, "");
  // A vision-language model's text model is its text_config; without one the
  // text keys are at the top level (older Qwen2-VL style configs).
  const Json* text = &root;
  std::string prefix;
  if (top.present("text_config") && !root.at("text_config").is_null()) {
    if (!root.at("text_config").is_object()) top.bad("text_config", "an object", root.at("text_config"));
    text = &root.at("text_config");
    prefix = "text_config.";
  }
  const Reader bare(fn, text, prefix);
  ModelRope m;
  m.model_type = bare.string("model_type").value_or(top.string("model_type").value_or(""));
  const Family family = family_of(m.model_type);
  if (family.alibi || (m.model_type == "falcon" && bare.flag("alibi", false))) {
    fail(fn, prefix + "model_type", "a model with RoPE (this one uses ALiBi)", Json(m.model_type).dump());
  }
  const Reader cfg(fn, text, prefix, family.gemma3 ? &gemma3_defaults() : nullptr);

  Context c;
  c.cfg = &cfg;
  c.family = family;
  m.style = family.style;
  m.style_known = family.known;
  if (family.deepseek && !cfg.flag("rope_interleave", true)) m.style = Style::rotate_half;
  if (options.style) m.style = *options.style;

  // Head size.
  const auto hidden = cfg.has("hidden_size") ? cfg.positive_count("hidden_size") : cfg.positive_count("n_embd");
  const auto heads = cfg.has("num_attention_heads") ? cfg.positive_count("num_attention_heads")
                                                    : cfg.positive_count("n_head");
  const auto derived_head_dim = [&]() -> std::size_t {
    if (!hidden || !heads) cfg.missing("head_dim", "or hidden_size and num_attention_heads");
    return *hidden / *heads;
  };
  if (family.deepseek) {
    const auto rope_dim = cfg.positive_count("qk_rope_head_dim");
    if (!rope_dim) cfg.missing("qk_rope_head_dim", "DeepSeek rotates that many channels");
    const auto nope_dim = cfg.count("qk_nope_head_dim");
    if (!nope_dim) cfg.missing("qk_nope_head_dim", "DeepSeek's rotary channels follow them");
    c.head_dim = *rope_dim;
    m.rotary_offset = *nope_dim;
    m.qk_head_dim = *nope_dim + *rope_dim;
  } else if (family.chatglm) {
    c.head_dim = cfg.positive_count("kv_channels").value_or(0);
    if (c.head_dim == 0) c.head_dim = derived_head_dim();
  } else {
    c.head_dim = cfg.positive_count("head_dim").value_or(0);
    if (c.head_dim == 0) c.head_dim = derived_head_dim();
  }
  if (c.head_dim == 0) fail(fn, cfg.path("head_dim"), "> 0 (hidden_size / num_attention_heads)", 0);
  if (!family.deepseek) m.qk_head_dim = c.head_dim;

  c.top_theta = cfg.has("rope_theta") ? cfg.positive("rope_theta") : cfg.positive("rotary_emb_base");
  c.top_partial = cfg.has("partial_rotary_factor") ? cfg.number("partial_rotary_factor") : cfg.number("rotary_pct");
  c.gptj_rotary_dim = cfg.positive_count("rotary_dim");
  c.max_positions = cfg.has("max_position_embeddings") ? cfg.positive_count("max_position_embeddings")
                    : cfg.has("n_positions")           ? cfg.positive_count("n_positions")
                                                       : cfg.positive_count("seq_length");
  c.top_original = cfg.positive_count("original_max_position_embeddings");
  m.max_position_embeddings = c.max_positions.value_or(0);

  // The rope entry: rope_scaling when it is a non-empty object (as the
  // reference's `rope_scaling or rope_parameters`), else rope_parameters.
  const Json* block = nullptr;
  std::string block_key;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!cfg.present(key) || text->at(key).is_null()) continue;
    if (!text->at(key).is_object()) cfg.bad(key, "an object", text->at(key));
    if (text->at(key).empty()) continue;
    block = &text->at(key);
    block_key = key;
    break;
  }

  // Layers and their types.
  const auto layer_count = cfg.has("num_hidden_layers") ? cfg.positive_count("num_hidden_layers")
                           : cfg.has("num_layers")      ? cfg.positive_count("num_layers")
                                                        : cfg.positive_count("n_layer");
  m.num_layers = layer_count.value_or(0);
  std::vector<std::string> layer_types;
  if (const Json* lt = cfg.find("layer_types")) {
    if (!lt->is_array()) cfg.bad("layer_types", "a list of strings", *lt);
    for (std::size_t i = 0; i < lt->size(); ++i) {
      if (!(*lt)[i].is_string()) fail(fn, rope::detail::indexed(cfg.path("layer_types"), i), "a string", (*lt)[i].dump());
      layer_types.push_back((*lt)[i].get<std::string>());
    }
  }
  const auto require_layers = [&](const char* why) {
    if (m.num_layers == 0) cfg.missing("num_hidden_layers", why);
  };
  const auto sliding_pattern = [&](std::size_t fallback) {
    // Layer i is sliding unless (i + 1) is a multiple of the pattern.
    if (!layer_types.empty()) return;
    require_layers("the sliding-window pattern spans them");
    const std::size_t pattern = cfg.positive_count("sliding_window_pattern").value_or(fallback);
    for (std::size_t i = 0; i < m.num_layers; ++i) {
      layer_types.push_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
    }
  };

  // Gemma 3 and Cohere 2 name their layer types by a pattern when the
  // config has no layer_types list.
  if (family.gemma3 || cfg.has("rope_local_base_freq")) sliding_pattern(6);
  if (family.cohere2) sliding_pattern(4);

  c.per_layer = false;
  if (block != nullptr && !layer_types.empty()) {
    bool all_types = true;
    for (const auto& item : block->items()) {
      bool found = false;
      for (const auto& t : layer_types) found = found || t == item.key();
      all_types = all_types && found;
    }
    c.per_layer = all_types;
  }

  const auto entry_reader = [&](const Json* entry, const std::string& key_path) {
    return Reader(fn, entry, key_path.empty() ? prefix : key_path + ".");
  };
  const std::string block_path = block_key.empty() ? std::string() : cfg.path(block_key);
  const Reader single = entry_reader(block, block_path);

  std::vector<std::string> kind_names;  // layer type of each kind, parallel to m.kinds
  const auto kind_index = [&](const std::string& name) {
    for (std::size_t i = 0; i < kind_names.size(); ++i) {
      if (kind_names[i] == name) return i;
    }
    return kind_names.size();
  };
  const auto assign_by_type = [&]() {
    if (m.num_layers == 0) m.num_layers = layer_types.size();
    if (layer_types.size() != m.num_layers) {
      fail(fn, cfg.path("layer_types"), "num_hidden_layers = " + to_text(m.num_layers) + " entries long",
           Json(layer_types).dump());
    }
    for (std::size_t i = 0; i < layer_types.size(); ++i) {
      const std::size_t k = kind_index(layer_types[i]);
      if (k == kind_names.size()) {
        fail(fn, rope::detail::indexed(cfg.path("layer_types"), i), "one of " + Json(kind_names).dump(),
             Json(layer_types[i]).dump());
      }
      m.layer_kind.push_back(k);
    }
  };
  const auto head_dim_for = [&](const std::string& layer_type) {
    if (family.gemma4 && layer_type == "full_attention") return cfg.positive_count("global_head_dim").value_or(c.head_dim);
    return c.head_dim;
  };

  if (c.per_layer) {
    // rope_parameters: {"full_attention": {...}, "sliding_attention": {...}}.
    for (const auto& t : layer_types) {
      if (kind_index(t) != kind_names.size()) continue;
      const auto it = block->find(t);
      if (it == block->end() || !it->is_object()) {
        fail(fn, block_path + "." + t, "an object (layer_types names this layer type)",
             it == block->end() ? std::string("nothing") : it->dump());
      }
      kind_names.push_back(t);
      m.kinds.push_back(read_kind(c, entry_reader(&*it, block_path + "." + t), t, head_dim_for(t)));
    }
    assign_by_type();
  } else if (family.gemma3 || cfg.has("rope_local_base_freq")) {
    // Gemma 3: global layers use rope_theta and the rope entry, sliding ones
    // the plain schedule at rope_local_base_freq.
    kind_names.push_back("full_attention");
    m.kinds.push_back(read_kind(c, single, "full_attention", c.head_dim));
    LayerRope local = read_kind(c, entry_reader(nullptr, ""), "sliding_attention", c.head_dim);
    local.base = cfg.required_positive("rope_local_base_freq", "sliding layers use it");
    kind_names.push_back("sliding_attention");
    m.kinds.push_back(local);
    assign_by_type();
  } else if (family.cohere2) {
    // Command R7B / A: only sliding-window layers rotate.
    kind_names.push_back("sliding_attention");
    m.kinds.push_back(read_kind(c, single, "sliding_attention", c.head_dim));
    LayerRope nope;
    nope.layer_type = "full_attention";
    nope.rotates = false;
    nope.head_dim = c.head_dim;
    kind_names.push_back("full_attention");
    m.kinds.push_back(nope);
    assign_by_type();
  } else if (cfg.has("no_rope_layers") || cfg.has("no_rope_layer_interval") || family.llama4) {
    // no_rope_layers[i] = 1: layer i rotates; an empty or absent list is
    // built from the interval (every interval-th layer has no RoPE).
    auto flags = cfg.count_list("no_rope_layers").value_or(std::vector<std::size_t>{});
    if (flags.empty()) {
      require_layers("no_rope_layers is built from the interval");
      const std::size_t interval = cfg.positive_count("no_rope_layer_interval").value_or(4);
      for (std::size_t i = 0; i < m.num_layers; ++i) flags.push_back((i + 1) % interval != 0 ? 1 : 0);
    }
    if (m.num_layers == 0) m.num_layers = flags.size();
    if (flags.size() != m.num_layers) {
      fail(fn, cfg.path("no_rope_layers"), "num_hidden_layers = " + to_text(m.num_layers) + " entries long",
           Json(flags).dump());
    }
    m.kinds.push_back(read_kind(c, single, "", c.head_dim));
    LayerRope nope;
    nope.rotates = false;
    nope.head_dim = c.head_dim;
    m.kinds.push_back(nope);
    for (const auto f : flags) m.layer_kind.push_back(f != 0 ? 0 : 1);
  } else {
    m.kinds.push_back(read_kind(c, single, "", c.head_dim));
  }

  // kinds[0] is the main kind: full attention if it rotates, else the first
  // kind that rotates.
  std::size_t main = m.kinds.size();
  for (std::size_t i = 0; i < m.kinds.size() && main == m.kinds.size(); ++i) {
    if (m.kinds[i].rotates && m.kinds[i].layer_type == "full_attention") main = i;
  }
  for (std::size_t i = 0; i < m.kinds.size() && main == m.kinds.size(); ++i) {
    if (m.kinds[i].rotates) main = i;
  }
  if (main != m.kinds.size() && main != 0) {
    std::swap(m.kinds[0], m.kinds[main]);
    for (auto& k : m.layer_kind) k = k == main ? 0 : (k == 0 ? main : k);
  }
  const LayerRope& primary = m.kinds[0];
  m.head_dim = primary.head_dim;
  m.rotary_dim = primary.rotary_dim;
  m.base = primary.base;
  m.rope_type = primary.rope_type;
  m.scaling = primary.scaling;
  if (!family.deepseek) m.qk_head_dim = primary.head_dim;

  // The entry of the main kind: M-RoPE sections and temperatures live there.
  const Reader main_entry =
      c.per_layer ? entry_reader(&block->at(primary.layer_type), block_path + "." + primary.layer_type) : single;
  m.mrope = pair_axes(c, main_entry, primary.rotary_dim);

  if (family.gemma_scalar) m.query_pre_attn_scalar = cfg.positive("query_pre_attn_scalar");
  if (family.deepseek && block != nullptr && primary.rope_type != "default") {
    // DeepSeek's attention multiplies its softmax scale by
    // g(factor, mscale_all_dim)^2 (yarn_get_mscale), whatever the rope entry's
    // own attention factor.
    const double all_dim = main_entry.number("mscale_all_dim").value_or(0.0);
    if (all_dim != 0.0) {
      double factor = 1.0;
      if (const auto* y = std::get_if<scaling::Yarn>(&primary.scaling)) {
        factor = y->factor;
      } else {
        factor = main_entry.required_positive("factor", "DeepSeek's softmax scale reads it");
      }
      const double g = static_cast<double>(rope::detail::yarn_g(factor, all_dim));
      m.score_scale = g * g;
    }
  }
  const double divisor = m.query_pre_attn_scalar ? *m.query_pre_attn_scalar : static_cast<double>(m.qk_head_dim);
  m.softmax_scale = family.unit_scale ? m.score_scale : m.score_scale / std::sqrt(divisor);
  if (const auto beta = main_entry.number("llama_4_scaling_beta")) {
    // Mistral's position-dependent query scale.
    const auto length = primary.rope_type == "yarn" || primary.rope_type == "llama3" || primary.rope_type == "longrope"
                            ? std::optional<std::size_t>(original_length(c, main_entry))
                            : main_entry.positive_count("original_max_position_embeddings");
    if (!length) main_entry.missing("original_max_position_embeddings", "llama_4_scaling_beta divides positions by it");
    m.temperature = QueryTemperature{*beta, static_cast<double>(*length), 0, false};
  } else if (family.llama4 && cfg.flag("attn_temperature_tuning", true)) {
    const double scale = cfg.number("attn_scale").value_or(0.1);
    const double length = static_cast<double>(cfg.positive_count("floor_scale").value_or(8192));
    m.temperature = QueryTemperature{scale, length, 1, true};
  }
  return m;
}

}  // namespace rope::hf::detail
