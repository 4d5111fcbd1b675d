// rope/hf/layers.hpp — the kinds of layer of a model and which layer is
// which: per layer type (rope_parameters keyed by layer_types), Gemma 3's
// global and local layers, Cohere 2's rotating sliding layers, NoPE layers
// (no_rope_layers, Llama 4), or one kind for all; then the main kind first.
// Internal to rope::hf.
#pragma once

#include <algorithm>
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

inline void require_layers(const Reader& cfg, const ModelRope& model, const std::string& why) {
  if (model.num_layers == 0) cfg.missing("num_hidden_layers", why);
}

// Layer types named by an interval: layer i is full_attention when (i + 1)
// is a multiple of the interval, else `other`. The interval is the key's
// value, or `fallback` (always, when key is null: a fixed pattern).
inline void interval_pattern(Config& config, const ModelRope& model, const char* key, std::size_t fallback,
                             const char* other) {
  if (!config.layer_types.empty()) return;
  require_layers(config.cfg(), model,
                 key != nullptr ? "layer_types are built from " + std::string(key) : "layer_types are built from it");
  const std::size_t interval = key != nullptr ? config.cfg().positive_count(key).value_or(fallback) : fallback;
  for (std::size_t i = 0; i < model.num_layers; ++i) {
    config.layer_types.push_back((i + 1) % interval != 0 ? other : "full_attention");
  }
}

// Layer i is sliding unless (i + 1) is a multiple of sliding_window_pattern
// (Gemma 3, Cohere 2, Exaone 4 without layer_types).
inline void sliding_pattern(Config& config, const ModelRope& model, std::size_t fallback) {
  interval_pattern(config, model, "sliding_window_pattern", fallback, "sliding_attention");
}

// Exaone 4 has a sliding window unless its config sets sliding_window to
// null: Exaone4Config's field defaults to 4096 when the key is absent.
inline bool exaone4_windowed(const Reader& cfg) {
  return !(cfg.present("sliding_window") && cfg.object()->at("sliding_window").is_null());
}

// Exaone4Config.__post_init__ without layer_types: layer i is sliding unless
// (i + 1) is a multiple of sliding_window_pattern (default 4). A null
// sliding_window sets the pattern to 0 (the reference then divides by zero)
// and a string pattern ("LLLG") cannot be divided by: both are refused.
inline void exaone4_layer_types(Config& config, const ModelRope& model) {
  if (!config.layer_types.empty()) return;
  const Reader& cfg = config.cfg();
  if (!exaone4_windowed(cfg)) {
    cfg.missing("layer_types", "with sliding_window null Exaone4Config builds them from a pattern of 0");
  }
  if (cfg.present("sliding_window_pattern") && cfg.object()->at("sliding_window_pattern").is_null()) {
    cfg.bad("sliding_window_pattern", "a whole number > 0 (layer_types are built from it)", nullptr);
  }
  sliding_pattern(config, model, 4);
}

// A list of layer type names under key.
inline void read_type_list(const Reader& cfg, const char* key, std::vector<std::string>& out) {
  const Json& types = *cfg.find(key);
  if (!types.is_array()) cfg.bad(key, "a list of strings", types);
  for (std::size_t i = 0; i < types.size(); ++i) {
    if (!types[i].is_string()) fail(cfg.fn(), {cfg.path(key), "[", i, "]"}, "a string", types[i].dump());
    out.push_back(types[i].get<std::string>());
  }
}

// Lfm2Config without layer_types: full_attention at full_attn_idxs, conv
// elsewhere; without either, every layer is full_attention. Lfm2MoeConfig
// builds none: its configs list them.
inline void lfm2_layer_types(Config& config, const ModelRope& model) {
  if (!config.layer_types.empty()) return;
  const Reader& cfg = config.cfg();
  if (config.context.family.type == "lfm2_moe") cfg.missing("layer_types", "Lfm2MoeConfig builds none");
  require_layers(cfg, model, "layer_types are built from full_attn_idxs");
  const auto idxs = cfg.count_list("full_attn_idxs");
  for (std::size_t i = 0; i < model.num_layers; ++i) {
    const bool full = !idxs || std::find(idxs->begin(), idxs->end(), i) != idxs->end();
    config.layer_types.push_back(full ? "full_attention" : "conv");
  }
  if (idxs) {
    for (std::size_t k = 0; k < idxs->size(); ++k) {
      if ((*idxs)[k] >= model.num_layers) {
        fail(cfg.fn(), {cfg.path("full_attn_idxs"), "[", k, "]"},
             {"a layer index < num_hidden_layers = ", model.num_layers}, (*idxs)[k]);
      }
    }
  }
}

// MiMo-V2-Flash: hybrid_layer_pattern[i] == 1 marks a sliding-window layer,
// any other value full attention (MiMoV2DecoderLayer, vLLM's
// is_compressed_softmax_layer), for the first num_hidden_layers entries;
// without it the configuration builds one from hybrid_block_size (layer i
// full when (i + 1) is a multiple of it). A layer_types key (the modeling
// code writes one from the pattern) must agree.
inline void mimo_layer_types(Config& config, const ModelRope& model) {
  const Reader& cfg = config.cfg();
  require_layers(cfg, model, "MiMo-V2-Flash's configurations default it differently (32, 48)");
  std::vector<std::string> types;
  if (const auto pattern = cfg.count_list("hybrid_layer_pattern")) {
    if (pattern->size() < model.num_layers) {
      fail(cfg.fn(), cfg.path("hybrid_layer_pattern"), {"at least num_hidden_layers = ", model.num_layers, " entries"},
           Json(*pattern).dump());
    }
    for (std::size_t i = 0; i < model.num_layers; ++i) {
      types.push_back((*pattern)[i] == 1 ? "sliding_attention" : "full_attention");
    }
  } else if (const auto block = cfg.positive_count("hybrid_block_size")) {
    for (std::size_t i = 0; i < model.num_layers; ++i) {
      types.push_back((i + 1) % *block == 0 ? "full_attention" : "sliding_attention");
    }
  } else {
    cfg.missing("hybrid_layer_pattern", "or hybrid_block_size: they tell MiMo-V2-Flash's layers apart");
  }
  if (!config.layer_types.empty() && config.layer_types != types) {
    fail(cfg.fn(), cfg.path("layer_types"), "the types hybrid_layer_pattern gives, " + Json(types).dump(),
         Json(config.layer_types).dump());
  }
  config.layer_types = types;
}

// GraniteMoeHybridConfig: layer_types, or layers_block_type (its alias),
// else every layer "mamba".
inline void granite_hybrid_layer_types(Config& config, const ModelRope& model) {
  if (!config.layer_types.empty()) return;
  const Reader& cfg = config.cfg();
  if (cfg.has("layers_block_type")) {
    read_type_list(cfg, "layers_block_type", config.layer_types);
    return;
  }
  require_layers(cfg, model, "every layer is mamba without layer_types");
  config.layer_types.assign(model.num_layers, "mamba");
}

// num_hidden_layers and the type of each layer (layer_types, or a pattern).
inline void read_layer_types(Config& config, ModelRope& model) {
  const Reader& cfg = config.cfg();
  const Family& family = config.context.family;
  const auto layer_count = cfg.has("num_hidden_layers") ? cfg.positive_count("num_hidden_layers")
                           : cfg.has("num_layers")      ? cfg.positive_count("num_layers")
                                                        : cfg.positive_count("n_layer");
  model.num_layers = layer_count.value_or(0);
  if (cfg.has("layer_types")) read_type_list(cfg, "layer_types", config.layer_types);
  // Gemma3nTextConfig, Olmo3Config: every 5th / 4th layer is full attention.
  if (family.gemma3n) interval_pattern(config, model, nullptr, 5, "sliding_attention");
  if (family.olmo3) interval_pattern(config, model, nullptr, 4, "sliding_attention");
  // AfmoeConfig: every global_attn_every_n_layers-th layer (default 4).
  if (family.afmoe) interval_pattern(config, model, "global_attn_every_n_layers", 4, "sliding_attention");
  if (family.conv_mixer) lfm2_layer_types(config, model);
  if (family.mamba_mixer) granite_hybrid_layer_types(config, model);
  if (family.gemma3 || cfg.has("rope_local_base_freq")) sliding_pattern(config, model, 6);
  if (family.cohere2) sliding_pattern(config, model, 4);
  if (family.exaone4) exaone4_layer_types(config, model);
  // Qwen3NextConfig.__post_init__ without layer_types: every
  // full_attention_interval-th layer (default 4) is full attention, the rest
  // linear_attention.
  if (family.qwen3_next) interval_pattern(config, model, "full_attention_interval", 4, "linear_attention");
  if (family.mimo) mimo_layer_types(config, model);
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

// Gemma 4's full-attention layers have global_head_dim channels.
// MiMo-V2-Flash's sliding-window layers have swa_head_dim channels (its
// modeling code and vLLM read it for them).
inline std::size_t head_dim_for(const Config& config, const std::string& layer_type) {
  if (config.context.family.gemma4 && layer_type == "full_attention") {
    return config.cfg().positive_count("global_head_dim").value_or(config.context.head_dim);
  }
  if (config.context.family.mimo && layer_type == "sliding_attention") {
    const auto dim = config.cfg().positive_count("swa_head_dim");
    if (!dim) config.cfg().missing("swa_head_dim", "MiMo-V2-Flash's sliding-window layers have that many channels");
    return *dim;
  }
  return config.context.head_dim;
}

// Gemma 3 (and configs with rope_local_base_freq): sliding layers take the
// plain schedule at that base; the rope entry is the global layers' alone.
inline bool local_base(const Config& config) {
  return config.context.family.gemma3 || config.cfg().has("rope_local_base_freq");
}

// A kind of layer that applies no RoPE.
inline LayerRope nope_kind(std::string layer_type, std::size_t head_dim) {
  LayerRope nope;
  nope.layer_type = std::move(layer_type);
  nope.rotates = false;
  nope.head_dim = head_dim;
  return nope;
}

// OLMo 3's sliding layers: the default rope, the rope entry (its scaling)
// being the full-attention layers' alone (Olmo3Config's per-layer-type
// parameters, Olmo3RotaryEmbedding per layer type). Their base is where the
// releases differ: the configuration of the per-layer-type releases gives
// them its default_theta, 500000, whatever the config says, the earlier
// modeling code the config's rope_theta. They agree only when rope_theta is
// 500000: anything else is refused.
inline LayerRope olmo3_sliding_kind(const Config& config, const std::string& type) {
  const Reader entry = config.single_entry();
  const std::string key = entry.has("rope_theta") ? entry.path("rope_theta") : config.cfg().path("rope_theta");
  const auto theta = entry.has("rope_theta") ? entry.positive("rope_theta") : config.context.top_theta;
  if (!theta || *theta != 500000.0) {
    fail(config.cfg().fn(), key,
         "500000 for OLMo 3's sliding-window layers (its releases give them 500000 or the config's rope_theta)",
         theta ? Json(*theta).dump() : std::string("nothing"));
  }
  Context c = config.context;
  c.top_theta = theta;
  return read_kind(c, config.entry(nullptr, ""), type, head_dim_for(config, type));
}

// The rotating kind of a layer type: its own entry of a per-layer-type
// block, Gemma 3's local schedule for sliding layers, else the one entry.
inline LayerRope rotating_kind(const Config& config, const std::string& type) {
  const Context& c = config.context;
  if (c.per_layer) {
    const Json& block = *config.block.json;
    const std::string path = config.block.path + "." + type;
    const auto it = block.find(type);
    if (it == block.end() || !it->is_object()) {
      fail(config.cfg().fn(), path, "an object (layer_types names this layer type)",
           it == block.end() ? std::string("nothing") : it->dump());
    }
    return read_kind(c, config.entry(&*it, path), type, head_dim_for(config, type));
  }
  if (c.family.olmo3 && type == "sliding_attention") return olmo3_sliding_kind(config, type);
  if (c.family.mimo && type == "sliding_attention") {
    // MiMoV2Attention of a sliding-window layer: the default rope at
    // swa_rope_theta (vLLM falls back to rope_theta, the modeling code has
    // none: it must be given).
    LayerRope local = read_kind(c, config.entry(nullptr, ""), type, head_dim_for(config, type));
    local.base = config.cfg().required_positive("swa_rope_theta", "MiMo-V2-Flash's sliding-window layers use it");
    return local;
  }
  if (local_base(config) && type == "sliding_attention") {
    // Gemma3TextConfig: rope_parameters["sliding_attention"] is the default
    // rope at rope_local_base_freq; rope_scaling goes to full_attention only.
    LayerRope local = read_kind(c, config.entry(nullptr, ""), type, head_dim_for(config, type));
    local.base = config.cfg().required_positive("rope_local_base_freq", "sliding layers use it");
    return local;
  }
  return read_kind(c, config.single_entry(), type, head_dim_for(config, type));
}

// no_rope_layers[i] = 1: layer i rotates; an empty or absent list is built
// from the interval (every interval-th layer has no RoPE): Llama4TextConfig
// and SmolLM3Config.__post_init__ build it so, the interval defaulting to 4.
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
    fail(cfg.fn(), cfg.path("no_rope_layers"), {"num_hidden_layers = ", model.num_layers, " entries long"},
         Json(flags).dump());
  }
  return flags;
}

// MllamaTextModel: the layers of cross_attention_layers are cross-attention
// layers (no self-attention, no RoPE); flag 1 = a self-attention layer.
inline std::vector<std::size_t> self_attention_flags(const Config& config, ModelRope& model) {
  const Reader& cfg = config.cfg();
  require_layers(cfg, model, "cross_attention_layers index the layers");
  const auto cross = cfg.count_list("cross_attention_layers").value_or(std::vector<std::size_t>{});
  std::vector<std::size_t> flags(model.num_layers, 1);
  // The reference asks whether a layer's index is in the list: an index
  // past the last layer names none (the class default lists 40 layers).
  for (const std::size_t layer : cross) {
    if (layer < model.num_layers) flags[layer] = 0;
  }
  return flags;
}

// Whether a layer of this type rotates, as the family's attention decides:
// Qwen3-Next's and MiniMax-style linear_attention layers are gated-delta /
// lightning mixers without position embedding (Qwen3NextDecoderLayer
// calls linear_attn without position_embeddings); Cohere 2 rotates only
// sliding-window layers (Cohere2Attention applies RoPE when its
// sliding_window is set); Exaone 4 likewise once a sliding_window is
// configured (Exaone4Attention: `if self.sliding_window is None or
// self.is_sliding`), every layer otherwise.
inline bool type_rotates(const Config& config, const std::string& type) {
  const Family& f = config.context.family;
  if (f.linear_nope && type == "linear_attention") return false;
  if (f.conv_mixer) return type == "full_attention";  // Lfm2DecoderLayer: is_attention_layer
  if (f.mamba_mixer) {
    // GraniteMoeHybridModel: rotary_emb only if position_embedding_type == "rope".
    const bool attention = type == "attention" || type == "full_attention";
    return attention && config.cfg().string("position_embedding_type").value_or("") == "rope";
  }
  if (f.cohere2 || f.afmoe) return type == "sliding_attention";
  if (f.exaone4 && exaone4_windowed(config.cfg())) return type == "sliding_attention";
  return true;
}

// The kinds of layer and the kind of each layer: one kind per (layer type,
// rotates) pair the layers have, in the order of their first layer.
inline void read_kinds(const Config& config, ModelRope& model) {
  const Reader& cfg = config.cfg();
  const Family& family = config.context.family;
  const std::vector<std::string>& types = config.layer_types;
  std::vector<std::size_t> flags;
  if (cfg.has("no_rope_layers") || cfg.has("no_rope_layer_interval") || family.nope_interval) {
    flags = rotating_layer_flags(config, model);
  }
  if (family.mllama) flags = self_attention_flags(config, model);
  if (!types.empty()) {
    if (model.num_layers == 0) model.num_layers = types.size();
    if (types.size() != model.num_layers) {
      fail(cfg.fn(), cfg.path("layer_types"), {"num_hidden_layers = ", model.num_layers, " entries long"},
           Json(types).dump());
    }
    if (!flags.empty() && flags.size() != types.size()) {
      fail(cfg.fn(), cfg.path("no_rope_layers"), {"as long as layer_types (", types.size(), ")"}, Json(flags).dump());
    }
    if (const auto* known = known_layer_types(family, local_base(config))) {
      for (std::size_t i = 0; i < types.size(); ++i) {
        if (std::find(known->begin(), known->end(), types[i]) == known->end()) {
          fail(cfg.fn(), {cfg.path("layer_types"), "[", i, "]"}, "one of " + Json(*known).dump(),
               Json(types[i]).dump());
        }
      }
    }
  }
  const std::size_t layers = !types.empty() ? types.size() : flags.size();
  if (layers == 0) {
    model.kinds.push_back(read_kind(config.context, config.single_entry(), "", config.context.head_dim));
    return;
  }
  for (std::size_t i = 0; i < layers; ++i) {
    const std::string type = types.empty() ? std::string() : types[i];
    const bool rotates = type_rotates(config, type) && (flags.empty() || flags[i] != 0);
    std::size_t k = 0;
    while (k < model.kinds.size() && !(model.kinds[k].layer_type == type && model.kinds[k].rotates == rotates)) ++k;
    if (k == model.kinds.size()) {
      model.kinds.push_back(rotates ? rotating_kind(config, type) : nope_kind(type, head_dim_for(config, type)));
    }
    model.layer_kind.push_back(k);
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
