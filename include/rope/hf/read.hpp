// rope/hf/read.hpp — a whole config read into a ModelRope, in the phases of
// docs/hf_config.md ("How a config is read"): the text model, its family and
// pairing, the head's channels, the rope entry, the kinds of layer and which
// layer is which, the main kind, M-RoPE, the attention-score factors and
// the MLA description.
// Internal to rope::hf; hf_config.hpp holds the entry points.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "families.hpp"
#include "layers.hpp"
#include "mla.hpp"
#include "model.hpp"
#include "mrope.hpp"
#include "reader.hpp"
#include "remote_families.hpp"
#include "rope_entry.hpp"

namespace rope::hf::detail {

// The keys of the text model: the nested language-model config when the
// config has one (text_config of vision-language models, llm_config of
// InternVL-style and language_config of DeepSeek-VL-style checkpoints), else
// the top level (older Qwen2-VL style configs).
struct TextModel {
  const Json* keys = nullptr;
  std::string prefix;  // "text_config." or ""
};

inline constexpr const char* kNestedKeys[] = {"text_config", "llm_config", "language_config"};

inline TextModel text_model(const char* fn, const Json& root) {
  if (!root.is_object()) fail(fn, "the config", "a JSON object", root.dump());
  const Reader top(fn, &root, "");
  for (const char* key : kNestedKeys) {
    if (top.present(key) && !root.at(key).is_null()) {
      if (!root.at(key).is_object()) top.bad(key, "an object", root.at(key));
      return TextModel{&root.at(key), std::string(key) + "."};
    }
  }
  return TextModel{&root, ""};
}

// The family row a model_type (or the caller, or an architectures entry)
// names; null for none.
struct FamilyChoice {
  const FamilyRow* row = nullptr;
  std::string via;  // "model_type", "ParseOptions::family", "architectures[i]"
};

inline FamilyChoice choose_family(const char* fn, const Reader& top, const Reader& bare, const std::string& type,
                                  const ParseOptions& options) {
  if (options.family) {
    const FamilyRow* row = family_row(*options.family);
    if (row == nullptr) fail(fn, "ParseOptions::family", "a model_type of rope's family table", *options.family);
    return FamilyChoice{row, "ParseOptions::family"};
  }
  if (const FamilyRow* row = family_row(type)) return FamilyChoice{row, "model_type"};
  // The reference instantiates the class architectures names (remote code
  // for a derivative such as Kimi K2 declares DeepseekV3ForCausalLM).
  for (const Reader* r : {&bare, &top}) {
    const Json* arch = r->find("architectures");
    if (arch == nullptr || !arch->is_array()) continue;
    for (std::size_t i = 0; i < arch->size(); ++i) {
      if (!(*arch)[i].is_string()) continue;
      if (const FamilyRow* row = family_of_architecture((*arch)[i].get<std::string>())) {
        return FamilyChoice{row, rope::detail::indexed(r->path("architectures"), i)};
      }
    }
  }
  return FamilyChoice{};
}

// The model type and its family. ALiBi models have no RoPE to read; a type
// rope has no family for is refused unless the caller says how to read it.
inline Family model_family(const char* fn, const Json& root, const TextModel& text, const ParseOptions& options,
                           ModelRope& model) {
  const Reader top(fn, &root, "");
  const Reader bare(fn, text.keys, text.prefix);
  model.model_type = bare.string("model_type").value_or(top.string("model_type").value_or(""));
  const FamilyChoice choice = choose_family(fn, top, bare, model.model_type, options);
  Family family;
  if (choice.row != nullptr) {
    family = family_from_row(*choice.row);
    model.family = choice.row->model_type;
  } else if (!options.generic) {
    std::string nested;
    if (text.prefix.empty()) {
      for (const auto& item : root.items()) {
        if (item.value().is_object() && item.value().contains("model_type")) nested += " " + item.key();
      }
    }
    fail(fn, text.prefix + "model_type",
         "a model type of rope's family table (docs/hf_config.md), or an architectures entry naming one" +
             (nested.empty() ? std::string()
                             : "; the language model may be nested under" + nested + ", a key rope does not read") +
             ". To read it anyway, set ParseOptions::family to the family it follows, or ParseOptions::generic"
             " (with ParseOptions::style for its pairing) to read it as a plain decoder",
         Json(model.model_type).dump());
  } else {
    model.guessed = {"head_dim", "layers", "rotary_offset", "softmax_scale"};
    if (!options.style) model.guessed.insert(model.guessed.begin(), "style");
    for (const char* key : {"qk_rope_head_dim", "layer_types"}) {
      if (bare.has(key)) {
        fail(fn, bare.path(key), "absent in a generic read (set ParseOptions::family: this layout is a family's)",
             bare.find(key)->dump());
      }
    }
  }
  if (family.alibi || (model.family == "falcon" && bare.flag("alibi", false))) {
    fail(fn, text.prefix + "model_type", "a model with RoPE (this one uses ALiBi)", Json(model.model_type).dump());
  }
  if (family.no_rope) {
    fail(fn, text.prefix + "model_type", "a model with RoPE (this family's attention takes no position embedding)",
         Json(model.model_type).dump());
  }
  return family;
}

inline void choose_pairing(const Family& family, const Reader& cfg, const ParseOptions& options, ModelRope& model) {
  model.style = family.style;
  model.style_known = family.known;
  if (family.deepseek && !family.always_interleaved && !cfg.flag("rope_interleave", true)) {
    model.style = Style::rotate_half;
  }
  if (options.style) model.style = *options.style;
}

// hidden_size // num_attention_heads, the head size when head_dim is absent.
inline std::size_t derived_head_dim(const Reader& cfg, std::optional<std::size_t> hidden,
                                    std::optional<std::size_t> heads) {
  if (!hidden || !heads) cfg.missing("head_dim", "or hidden_size and num_attention_heads");
  return *hidden / *heads;
}

// The channels of the head the rotary part lies in, and DeepSeek's offset.
inline void read_head_dims(Context& c, ModelRope& model) {
  const Reader& cfg = *c.cfg;
  const auto hidden = cfg.has("hidden_size") ? cfg.positive_count("hidden_size") : cfg.positive_count("n_embd");
  const auto heads =
      cfg.has("num_attention_heads") ? cfg.positive_count("num_attention_heads") : cfg.positive_count("n_head");
  if (c.family.deepseek) {
    const auto rope_dim = cfg.positive_count("qk_rope_head_dim");
    if (!rope_dim) cfg.missing("qk_rope_head_dim", "DeepSeek rotates that many channels");
    const auto nope_dim = cfg.count("qk_nope_head_dim");
    if (!nope_dim) cfg.missing("qk_nope_head_dim", "DeepSeek's rotary channels follow them");
    c.head_dim = *rope_dim;
    model.rotary_offset = *nope_dim;
    model.qk_head_dim = *nope_dim + *rope_dim;
  } else {
    c.head_dim = cfg.positive_count(c.family.chatglm || c.family.kv_channels ? "kv_channels" : "head_dim").value_or(0);
    if (c.family.derived_head) {
      // The family's attention takes hidden_size // num_attention_heads
      // (GPTNeoXAttention, MllamaTextSelfAttention, ...; Cohere2Config sets
      // head_dim so): a head_dim saying otherwise is refused.
      const std::size_t derived = derived_head_dim(cfg, hidden, heads);
      if (c.head_dim != 0 && c.head_dim != derived) {
        fail(cfg.fn(), cfg.path("head_dim"),
             {"hidden_size / num_attention_heads = ", derived, ", the head size ", c.family.type, "'s attention uses"},
             c.head_dim);
      }
      c.head_dim = derived;
    }
    if (c.head_dim == 0) c.head_dim = derived_head_dim(cfg, hidden, heads);
  }
  if (c.head_dim == 0) fail(cfg.fn(), cfg.path("head_dim"), "> 0 (hidden_size / num_attention_heads)", 0);
  if (!c.family.deepseek) model.qk_head_dim = c.head_dim;
}

// The top-level keys every rope entry falls back on.
inline void read_shared_keys(Context& c, ModelRope& model) {
  const Reader& cfg = *c.cfg;
  c.top_theta = cfg.has("rope_theta") ? cfg.positive("rope_theta") : cfg.positive("rotary_emb_base");
  c.top_partial = cfg.has("partial_rotary_factor") ? cfg.number("partial_rotary_factor") : cfg.number("rotary_pct");
  c.gptj_rotary_dim = cfg.positive_count("rotary_dim");
  c.max_positions = cfg.has("max_position_embeddings") ? cfg.positive_count("max_position_embeddings")
                    : cfg.has("n_positions")           ? cfg.positive_count("n_positions")
                                                       : cfg.positive_count("seq_length");
  c.top_original = cfg.positive_count("original_max_position_embeddings");
  model.max_position_embeddings = c.max_positions.value_or(0);
}

// The rope entry: rope_scaling when it is a non-empty object (as the
// reference's `rope_scaling or rope_parameters`), else rope_parameters.
inline RopeBlock find_rope_block(const Reader& cfg) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!cfg.present(key) || cfg.object()->at(key).is_null()) continue;
    const Json& value = cfg.object()->at(key);
    if (!value.is_object()) cfg.bad(key, "an object", value);
    if (value.empty()) continue;
    return RopeBlock{&value, cfg.path(key)};
  }
  return RopeBlock{};
}

// The entry of the main kind: M-RoPE sections and temperatures live there.
inline Reader main_kind_entry(const Config& config, const ModelRope& model) {
  if (!config.context.per_layer) return config.single_entry();
  const std::string& type = model.kinds[0].layer_type;
  return config.entry(&config.block.json->at(type), config.block.path + "." + type);
}

// The factor on q.k before the softmax of a layer whose rotary part lies in
// head_dim channels, as the family's attention sets its scaling: from the
// layer's own q/k head size (DeepSeek: qk_nope + qk_rope head dims), Gemma
// 2/3's query_pre_attn_scalar, Granite's attention_multiplier, or 1 (Gemma
// 3n, Gemma 4); times score_scale.
inline double softmax_scale_of(const Family& family, const ModelRope& model, std::size_t head_dim,
                               double attention_multiplier) {
  if (family.attention_multiplier) return attention_multiplier;
  if (family.unit_scale) return model.score_scale;
  const double qk_head_dim = static_cast<double>(family.deepseek ? model.qk_head_dim : head_dim);
  return model.score_scale / std::sqrt(model.query_pre_attn_scalar ? *model.query_pre_attn_scalar : qk_head_dim);
}

// The factors on q.k before the softmax, the model's (its main kind's) and
// each kind's.
inline void read_score_scales(const Config& config, const Reader& main_entry, ModelRope& model) {
  const Family& family = config.context.family;
  if (family.gemma_scalar) model.query_pre_attn_scalar = config.cfg().positive("query_pre_attn_scalar");
  if (family.deepseek) {
    const double g = mla_mscale(config, main_entry, model);
    model.score_scale = g * g;
  }
  // GraniteConfig's attention_multiplier defaults to 1.
  const double multiplier =
      family.attention_multiplier ? config.cfg().positive("attention_multiplier").value_or(1.0) : 1.0;
  model.softmax_scale = softmax_scale_of(family, model, model.kinds[0].head_dim, multiplier);
  for (LayerRope& kind : model.kinds) kind.softmax_scale = softmax_scale_of(family, model, kind.head_dim, multiplier);
}

// A config a family's configuration would complete on its own in a way rope
// does not model: refused, saying what to give.
inline void require_family_keys(const Config& config) {
  const Family& family = config.context.family;
  const Reader& cfg = config.cfg();
  // Lfm2Config before its strict release read theta ahead of rope_theta;
  // the strict release reads rope_theta alone.
  if (family.conv_mixer && cfg.present("theta") && !cfg.object()->at("theta").is_null()) {
    const auto theta = cfg.positive("theta");
    if (!config.context.top_theta || *config.context.top_theta != *theta) {
      fail(cfg.fn(), cfg.path("theta"),
           {"absent, or equal to rope_theta (LFM2's releases read theta, or rope_theta alone)",
            config.context.top_theta ? ", which is " + Json(*config.context.top_theta).dump() : ""},
           Json(*theta).dump());
    }
  }
  if (family.internlm2) internlm2_keys(config);
  if (family.mimo) mimo_keys(config);
  if (family.require_entry && config.block.json == nullptr) {
    config.cfg().missing("rope_scaling", "or rope_parameters: without one, " + family.type +
                                             "'s configuration installs a rope entry of its own (llama3 or yarn), "
                                             "which rope does not guess");
  }
}

// A model none of whose layers applies RoPE has nothing for rope to do.
inline void require_rotating_layer(const Config& config, const ModelRope& model) {
  for (const LayerRope& kind : model.kinds) {
    if (kind.rotates) return;
  }
  const Reader& cfg = config.cfg();
  if (config.context.family.mamba_mixer) {
    const Json* type = cfg.find("position_embedding_type");
    fail(cfg.fn(), cfg.path("position_embedding_type"),
         "\"rope\" (no layer of this config applies RoPE otherwise) with attention layers among layer_types",
         type != nullptr ? type->dump() : std::string("nothing"));
  }
  fail(cfg.fn(), config.prefix + "model_type", "a model with RoPE (no layer of this config applies it)",
       Json(model.model_type).dump());
}

// Mistral's llama_4_scaling_beta, or Llama 4's attention temperature tuning.
inline void read_temperature(const Config& config, const Reader& main_entry, ModelRope& model) {
  const std::string& type = model.kinds[0].rope_type;
  if (const auto beta = main_entry.number("llama_4_scaling_beta")) {
    const auto length = type == "yarn" || type == "llama3" || type == "longrope"
                            ? std::optional<std::size_t>(original_length(config.context, main_entry))
                            : main_entry.positive_count("original_max_position_embeddings");
    if (!length) {
      main_entry.missing("original_max_position_embeddings", "llama_4_scaling_beta divides positions by it");
    }
    model.temperature = QueryTemperature{*beta, static_cast<double>(*length), 0, false};
  } else if (config.context.family.llama4 && config.cfg().flag("attn_temperature_tuning", true)) {
    const double scale = config.cfg().number("attn_scale").value_or(0.1);
    const double length = static_cast<double>(config.cfg().positive_count("floor_scale").value_or(8192));
    model.temperature = QueryTemperature{scale, length, 1, true};
  }
}

inline ModelRope read(const char* fn, const Json& root, const ParseOptions& options) {
  const TextModel text = text_model(fn, root);
  ModelRope model;
  const Family family = model_family(fn, root, text, options, model);
  const Reader cfg(fn, text.keys, text.prefix, family_defaults(family.type));
  Config config;
  config.context.cfg = &cfg;
  config.context.family = family;
  config.prefix = text.prefix;
  choose_pairing(family, cfg, options, model);
  read_head_dims(config.context, model);
  read_shared_keys(config.context, model);
  config.block = find_rope_block(cfg);
  require_family_keys(config);
  read_layer_types(config, model);
  config.context.per_layer = entries_per_layer_type(config.block, config.layer_types);
  config.context.per_layer_type_params = config.context.per_layer || local_base(config) || family.olmo3;
  read_kinds(config, model);
  require_rotating_layer(config, model);
  put_main_kind_first(family, model);
  const Reader main_entry = main_kind_entry(config, model);
  model.mrope = pair_axes(config.context, main_entry, model.rotary_dim);
  read_score_scales(config, main_entry, model);
  read_mla(config, main_entry, model);
  read_temperature(config, main_entry, model);
  for (LayerRope& kind : model.kinds) {
    kind.style = model.style;
    kind.rotary_offset = model.rotary_offset;
    if (kind.rotates && kind.rotary_dim == model.rotary_dim) kind.mrope = model.mrope;
  }
  return model;
}

}  // namespace rope::hf::detail
