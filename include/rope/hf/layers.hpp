// rope/hf/layers.hpp — the kinds of layer of a model and which layer is
// which: per layer type (rope_parameters keyed by layer_types), Gemma 3's
// global and local layers, Cohere 2's rotating sliding layers, NoPE layers
// (no_rope_layers, Llama 4), or one kind for all; then the main kind first.
// Internal to rope::hf.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "model.hpp"
#include "reader.hpp"
#include "rope_entry.hpp"

namespace rope::hf::detail {

// The rope block of a config: one rope entry, or one per layer type.
struct RopeBlock {
  const Json* json = nullptr;  // null when the config has neither
  std::string path;            // its key path ("text_config.rope_parameters"); "" when none
};

// A config being read: what every rope entry shares, the rope block and the
// layer types.
struct Config {
  Context context;
  std::string prefix;  // of the text model's keys
  RopeBlock block;
  std::vector<std::string> layer_types;

  const Reader& cfg() const { return *context.cfg; }
  // A rope entry at key_path; "" for none (its keys then read as absent).
  Reader entry(const Json* json, const std::string& key_path) const {
    return Reader(cfg().fn(), json, key_path.empty() ? prefix : key_path + ".");
  }
  // The one entry of a config whose block is not per layer type.
  Reader single_entry() const { return entry(block.json, block.path); }
};

inline void require_layers(const Reader& cfg, const ModelRope& model, const char* why) {
  if (model.num_layers == 0) cfg.missing("num_hidden_layers", why);
}

// Layer types named by a pattern: layer i is sliding unless (i + 1) is a
// multiple of sliding_window_pattern (Gemma 3, Cohere 2 without layer_types).
inline void sliding_pattern(Config& config, const ModelRope& model, std::size_t fallback) {
  if (!config.layer_types.empty()) return;
  require_layers(config.cfg(), model, "the sliding-window pattern spans them");
  const std::size_t pattern = config.cfg().positive_count("sliding_window_pattern").value_or(fallback);
  for (std::size_t i = 0; i < model.num_layers; ++i) {
    config.layer_types.push_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
  }
}

// num_hidden_layers and the type of each layer (layer_types, or a pattern).
inline void read_layer_types(Config& config, ModelRope& model) {
  const Reader& cfg = config.cfg();
  const auto layer_count = cfg.has("num_hidden_layers") ? cfg.positive_count("num_hidden_layers")
                           : cfg.has("num_layers")      ? cfg.positive_count("num_layers")
                                                        : cfg.positive_count("n_layer");
  model.num_layers = layer_count.value_or(0);
  if (const Json* types = cfg.find("layer_types")) {
    if (!types->is_array()) cfg.bad("layer_types", "a list of strings", *types);
    for (std::size_t i = 0; i < types->size(); ++i) {
      if (!(*types)[i].is_string()) {
        fail(cfg.fn(), rope::detail::indexed(cfg.path("layer_types"), i), "a string", (*types)[i].dump());
      }
      config.layer_types.push_back((*types)[i].get<std::string>());
    }
  }
  if (config.context.family.gemma3 || cfg.has("rope_local_base_freq")) sliding_pattern(config, model, 6);
  if (config.context.family.cohere2) sliding_pattern(config, model, 4);
}

// The rope block holds one entry per layer type: every key of it names one.
inline bool entries_per_layer_type(const RopeBlock& block, const std::vector<std::string>& layer_types) {
  if (block.json == nullptr || layer_types.empty()) return false;
  for (const auto& item : block.json->items()) {
    bool found = false;
    for (const auto& type : layer_types) found = found || type == item.key();
    if (!found) return false;
  }
  return true;
}

// The kind of layer type `name`: its index in kinds, or kinds.size().
inline std::size_t kind_index(const ModelRope& model, const std::string& name) {
  for (std::size_t i = 0; i < model.kinds.size(); ++i) {
    if (model.kinds[i].layer_type == name) return i;
  }
  return model.kinds.size();
}

// Each layer's kind from its layer type; layer_types is num_hidden_layers long.
inline void assign_kinds_by_type(const Config& config, ModelRope& model) {
  const Reader& cfg = config.cfg();
  const std::vector<std::string>& types = config.layer_types;
  if (model.num_layers == 0) model.num_layers = types.size();
  if (types.size() != model.num_layers) {
    fail(cfg.fn(), cfg.path("layer_types"), "num_hidden_layers = " + to_text(model.num_layers) + " entries long",
         Json(types).dump());
  }
  std::vector<std::string> names;
  for (const LayerRope& kind : model.kinds) names.push_back(kind.layer_type);
  for (std::size_t i = 0; i < types.size(); ++i) {
    const std::size_t k = kind_index(model, types[i]);
    if (k == model.kinds.size()) {
      fail(cfg.fn(), rope::detail::indexed(cfg.path("layer_types"), i), "one of " + Json(names).dump(),
           Json(types[i]).dump());
    }
    model.layer_kind.push_back(k);
  }
}

// Gemma 4's full-attention layers have global_head_dim channels.
inline std::size_t head_dim_for(const Config& config, const std::string& layer_type) {
  if (config.context.family.gemma4 && layer_type == "full_attention") {
    return config.cfg().positive_count("global_head_dim").value_or(config.context.head_dim);
  }
  return config.context.head_dim;
}

// rope_parameters: {"full_attention": {...}, "sliding_attention": {...}}.
inline void kinds_per_layer_type(const Config& config, ModelRope& model) {
  const Json& block = *config.block.json;
  for (const std::string& type : config.layer_types) {
    if (kind_index(model, type) != model.kinds.size()) continue;
    const std::string path = config.block.path + "." + type;
    const auto it = block.find(type);
    if (it == block.end() || !it->is_object()) {
      fail(config.cfg().fn(), path, "an object (layer_types names this layer type)",
           it == block.end() ? std::string("nothing") : it->dump());
    }
    model.kinds.push_back(read_kind(config.context, config.entry(&*it, path), type, head_dim_for(config, type)));
  }
  assign_kinds_by_type(config, model);
}

// Gemma 3: global layers use rope_theta and the rope entry, sliding ones
// the plain schedule at rope_local_base_freq.
inline void kinds_global_and_local(const Config& config, ModelRope& model) {
  const Context& c = config.context;
  model.kinds.push_back(read_kind(c, config.single_entry(), "full_attention", c.head_dim));
  LayerRope local = read_kind(c, config.entry(nullptr, ""), "sliding_attention", c.head_dim);
  local.base = config.cfg().required_positive("rope_local_base_freq", "sliding layers use it");
  model.kinds.push_back(local);
  assign_kinds_by_type(config, model);
}

// A kind of layer that applies no RoPE.
inline LayerRope nope_kind(std::string layer_type, std::size_t head_dim) {
  LayerRope nope;
  nope.layer_type = std::move(layer_type);
  nope.rotates = false;
  nope.head_dim = head_dim;
  return nope;
}

// Command R7B / A: only sliding-window layers rotate.
inline void kinds_sliding_rotate(const Config& config, ModelRope& model) {
  const Context& c = config.context;
  model.kinds.push_back(read_kind(c, config.single_entry(), "sliding_attention", c.head_dim));
  model.kinds.push_back(nope_kind("full_attention", c.head_dim));
  assign_kinds_by_type(config, model);
}

// no_rope_layers[i] = 1: layer i rotates; an empty or absent list is built
// from the interval (every interval-th layer has no RoPE).
inline std::vector<std::size_t> rotating_layer_flags(const Config& config, ModelRope& model) {
  const Reader& cfg = config.cfg();
  auto flags = cfg.count_list("no_rope_layers").value_or(std::vector<std::size_t>{});
  if (flags.empty()) {
    require_layers(cfg, model, "no_rope_layers is built from the interval");
    const std::size_t interval = cfg.positive_count("no_rope_layer_interval").value_or(4);
    for (std::size_t i = 0; i < model.num_layers; ++i) flags.push_back((i + 1) % interval != 0 ? 1 : 0);
  }
  if (model.num_layers == 0) model.num_layers = flags.size();
  if (flags.size() != model.num_layers) {
    fail(cfg.fn(), cfg.path("no_rope_layers"), "num_hidden_layers = " + to_text(model.num_layers) + " entries long",
         Json(flags).dump());
  }
  return flags;
}

// Llama 4 and configs with no_rope_layers: rotating layers and NoPE layers.
inline void kinds_with_nope_layers(const Config& config, ModelRope& model) {
  const Context& c = config.context;
  const std::vector<std::size_t> flags = rotating_layer_flags(config, model);
  model.kinds.push_back(read_kind(c, config.single_entry(), "", c.head_dim));
  model.kinds.push_back(nope_kind("", c.head_dim));
  for (const std::size_t f : flags) model.layer_kind.push_back(f != 0 ? 0 : 1);
}

// The kinds of layer and the kind of each layer.
inline void read_kinds(const Config& config, ModelRope& model) {
  const Reader& cfg = config.cfg();
  const Family& family = config.context.family;
  if (config.context.per_layer) {
    kinds_per_layer_type(config, model);
  } else if (family.gemma3 || cfg.has("rope_local_base_freq")) {
    kinds_global_and_local(config, model);
  } else if (family.cohere2) {
    kinds_sliding_rotate(config, model);
  } else if (cfg.has("no_rope_layers") || cfg.has("no_rope_layer_interval") || family.llama4) {
    kinds_with_nope_layers(config, model);
  } else {
    model.kinds.push_back(read_kind(config.context, config.single_entry(), "", config.context.head_dim));
  }
}

// kinds[0] is the main kind: full attention if it rotates, else the first
// kind that rotates. The model's own fields are copied from it.
inline void put_main_kind_first(const Family& family, ModelRope& model) {
  const std::size_t none = model.kinds.size();
  std::size_t main = none;
  for (std::size_t i = 0; i < none && main == none; ++i) {
    if (model.kinds[i].rotates && model.kinds[i].layer_type == "full_attention") main = i;
  }
  for (std::size_t i = 0; i < none && main == none; ++i) {
    if (model.kinds[i].rotates) main = i;
  }
  if (main != none && main != 0) {
    std::swap(model.kinds[0], model.kinds[main]);
    for (auto& k : model.layer_kind) k = k == main ? 0 : (k == 0 ? main : k);
  }
  const LayerRope& primary = model.kinds[0];
  model.head_dim = primary.head_dim;
  model.rotary_dim = primary.rotary_dim;
  model.base = primary.base;
  model.rope_type = primary.rope_type;
  model.scaling = primary.scaling;
  if (!family.deepseek) model.qk_head_dim = primary.head_dim;
}
}  // namespace rope::hf::detail
