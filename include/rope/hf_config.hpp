// rope/hf_config.hpp — a Hugging Face checkpoint's config.json read into the
// rotation its reference implementation applies.
//
//   rope::hf::ModelRope m = rope::hf::load("config.json");
//   rope::Table<float> table(m.frequencies(layer, seq_len), positions);
//   rope::apply(q_view, table, m.style, positions_ids);   // channels m.rotary_offset ..
//
// Pair p of the rotary part of a q/k head (channels rotary_offset ..
// rotary_offset + rotary_dim - 1, paired as m.style says) is rotated by
// position * theta_p, theta_p = frequencies(layer, seq_len).inv_freq[p], and
// every cos/sin is multiplied by its attention_factor. What the reader
// understands (both rope_scaling and rope_parameters spellings, text_config
// nesting, per-layer-type parameters, partial rotary, M-RoPE layouts, the
// pairing of each model family, DeepSeek's softmax scale, Llama 4 style
// query temperatures) and every key it reads are listed in docs/hf_config.md.
//
// Errors: rope::invalid_argument through rope::detail::fail, naming the key
// path as written in the file (text_config.rope_scaling.factor) and its
// value as JSON text. The reader is never stricter than the reference on a
// config it can compute: keys it does not use are ignored, as there.
//
// Needs nlohmann_json 3 (CMake target rope::hf_config); the core of rope does
// not include this header.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "detail/error.hpp"
#include "frequencies.hpp"
#include "pair_axes.hpp"
#include "style.hpp"

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

// The RoPE of one kind of layer (a model has one kind, or one per layer type).
struct LayerRope {
  std::string layer_type;        // its name in layer_types ("full_attention", ...), "" when the config has none
  bool rotates = true;           // false: a NoPE layer, which applies no rotation at all
  std::size_t head_dim = 0;      // channels of the head the rotary part lies in
  std::size_t rotary_dim = 0;    // channels rotated: rotary_dim / 2 pairs
  double base = 10000.0;         // theta of the schedule base^(-2p/rotary_dim)
  std::string rope_type = "none";  // "default", "linear", "yarn", ... (legacy names mapped); "none" when !rotates
  Scaling scaling;

  // inv_freq and attention factor at the current sequence length (number of
  // positions: largest position + 1; read by dynamic and longrope only).
  Frequencies frequencies(std::size_t seq_len = 0) const {
    if (!rotates) detail::fail("rope::hf::LayerRope::frequencies", "layer", "a layer that applies RoPE", layer_type);
    return rope::frequencies(rotary_dim, base, scaling, seq_len);
  }
};

// A model's RoPE as its config.json defines it.
struct ModelRope {
  std::string model_type;     // of the text model (text_config.model_type when nested)
  Style style = Style::rotate_half;
  bool style_known = false;   // model_type is in rope's pairing table (docs/hf_config.md); else the
                              // transformers default rotate_half was assumed (or ParseOptions::style given)
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

  const LayerRope& layer(std::size_t layer_index) const {
    check_layer(layer_index);
    return layer_kind.empty() ? kinds.front() : kinds[layer_kind[layer_index]];
  }
  bool rotates(std::size_t layer_index) const { return layer(layer_index).rotates; }

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
      detail::fail("rope::hf::ModelRope", "layer", "< num_layers = " + detail::to_text(num_layers), layer_index);
    }
  }
};

struct ParseOptions {
  // The pairing to use instead of the table's (a model type rope does not
  // know, a remote-code model whose modeling file differs).
  std::optional<Style> style;
};

namespace detail {

using Json = nlohmann::json;
using rope::detail::fail;
using rope::detail::to_text;

// What a model family's reference code does beyond the shared rope utilities.
struct Family {
  Style style = Style::rotate_half;
  bool known = false;
  bool deepseek = false;      // rope part = qk_rope_head_dim channels after qk_nope_head_dim; softmax mscale^2
  bool chatglm = false;       // rotates kv_channels / 2 channels, base 10000 * rope_ratio
  bool gemma3 = false;        // Gemma3TextConfig's defaults; sliding layers use rope_local_base_freq
  bool gemma4 = false;        // full_attention layers have global_head_dim channels
  bool gemma_scalar = false;  // softmax divides by query_pre_attn_scalar
  bool unit_scale = false;    // softmax scale 1 (q, k RMS-normalised)
  bool llama4 = false;        // NoPE layers every no_rope_layer_interval-th; temperature on them
  bool cohere2 = false;       // only sliding-window layers rotate
  bool qwen3_vl = false;      // M-RoPE interleaved whatever mrope_interleaved says
  bool ernie_vl = false;      // M-RoPE: h/w alternating, then t
  bool phi3 = false;          // legacy "type": "su" / "yarn" means longrope
  bool alibi = false;         // no RoPE at all
};

inline bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (s == n) return true;
  }
  return false;
}

// The pairing of each family, from its modeling code (docs/hf_config.md).
inline Family family_of(const std::string& t) {
  Family f;
  if (one_of(t, {"gptj", "codegen", "cohere", "cohere2", "glm", "glm4", "glm4v", "glm4v_text", "chatglm",
                 "deepseek_v2", "deepseek_v3", "llama4", "llama4_text", "ernie4_5", "ernie4_5_moe",
                 "ernie4_5_vl_moe", "ernie4_5_vl_moe_text", "helium"})) {
    f.style = Style::block_diagonal;
    f.known = true;
  } else if (one_of(t, {"llama", "mistral", "mixtral", "ministral", "ministral3", "mistral3", "qwen2", "qwen2_moe",
                        "qwen3", "qwen3_moe", "qwen3_next", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl",
                        "qwen2_5_vl_text", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text",
                        "gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text", "phi", "phi3",
                        "phimoe", "gpt_neox", "gpt_oss", "glm4_moe", "glm4v_moe", "glm4v_moe_text", "stablelm",
                        "starcoder2", "falcon", "olmo", "olmo2", "granite", "granitemoe", "smollm3",
                        "persimmon"})) {
    f.style = Style::rotate_half;
    f.known = true;
  }
  f.deepseek = one_of(t, {"deepseek_v2", "deepseek_v3"});
  f.chatglm = t == "chatglm";
  f.gemma3 = one_of(t, {"gemma3", "gemma3_text"});
  f.gemma4 = one_of(t, {"gemma4", "gemma4_text"});
  f.gemma_scalar = one_of(t, {"gemma2", "gemma3", "gemma3_text"});
  f.unit_scale = f.gemma4;
  f.llama4 = one_of(t, {"llama4", "llama4_text"});
  f.cohere2 = t == "cohere2";
  f.qwen3_vl = one_of(t, {"qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"});
  f.ernie_vl = one_of(t, {"ernie4_5_vl_moe", "ernie4_5_vl_moe_text"});
  f.phi3 = t == "phi3";
  f.alibi = one_of(t, {"bloom", "mpt"});
  return f;
}

// Gemma3TextConfig's defaults, which the reference fills in for keys a
// config omits (Gemma 3's multimodal configs give a text_config of a few
// keys only).
inline const Json& gemma3_defaults() {
  static const Json d = {{"rope_theta", 1000000.0},       {"rope_local_base_freq", 10000.0},
                         {"sliding_window_pattern", 6},   {"head_dim", 256},
                         {"num_attention_heads", 8},      {"hidden_size", 2304},
                         {"num_hidden_layers", 26},       {"max_position_embeddings", 131072},
                         {"query_pre_attn_scalar", 256}};
  return d;
}

// Typed access to one JSON object, with key paths for messages. A key
// holding null reads as absent, as Python's dict.get() makes it.
class Reader {
 public:
  Reader(const char* fn, const Json* object, std::string prefix, const Json* defaults = nullptr)
      : fn_(fn), object_(object), prefix_(std::move(prefix)), defaults_(defaults) {}

  const char* fn() const { return fn_; }
  std::string path(const std::string& key) const { return prefix_ + key; }
  const Json* object() const { return object_; }

  // The value, or the family default, or null when neither exists.
  const Json* find(const std::string& key) const {
    if (object_ != nullptr) {
      const auto it = object_->find(key);
      if (it != object_->end() && !it->is_null()) return &*it;
    }
    if (defaults_ != nullptr) {
      const auto it = defaults_->find(key);
      if (it != defaults_->end()) return &*it;
    }
    return nullptr;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // The key is in the object, even as null.
  bool present(const std::string& key) const { return object_ != nullptr && object_->contains(key); }

  [[noreturn]] void bad(const std::string& key, const std::string& requirement, const Json& value) const {
    fail(fn_, path(key), requirement, value.dump());
  }
  [[noreturn]] void missing(const std::string& key, const std::string& why) const {
    fail(fn_, path(key), "present (" + why + ")", "nothing");
  }

  std::optional<double> number(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) bad(key, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d)) bad(key, "finite", *v);
    return d;
  }
  std::optional<double> positive(const std::string& key) const {
    const auto d = number(key);
    if (d && !(*d > 0.0)) bad(key, "> 0", *find(key));
    return d;
  }
  double required_positive(const std::string& key, const std::string& why) const {
    const auto d = positive(key);
    if (!d) missing(key, why);
    return *d;
  }
  std::optional<std::size_t> count(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<std::size_t>();
    if (v->is_number_integer() && v->get<std::int64_t>() >= 0) return static_cast<std::size_t>(v->get<std::int64_t>());
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (d >= 0.0 && d == std::floor(d) && d < 9.0e15) return static_cast<std::size_t>(d);
    }
    bad(key, "a whole number >= 0", *v);
  }
  std::optional<std::size_t> positive_count(const std::string& key) const {
    const auto n = count(key);
    if (n && *n == 0) bad(key, "> 0", *find(key));
    return n;
  }
  std::optional<std::string> string(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) bad(key, "a string", *v);
    return v->get<std::string>();
  }
  // Python truthiness of a flag the reference tests with `if x:`; absent
  // keys take `absent`, null is false.
  bool flag(const std::string& key, bool absent) const {
    if (!present(key) && !(defaults_ != nullptr && defaults_->contains(key))) return absent;
    const Json* v = find(key);
    if (v == nullptr) return false;
    if (v->is_boolean()) return v->get<bool>();
    if (v->is_number()) return v->get<double>() != 0.0;
    bad(key, "true, false or a number", *v);
  }
  std::vector<double> positive_list(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) missing(key, "longrope needs it");
    if (!v->is_array()) bad(key, "a list of numbers", *v);
    std::vector<double> out;
    for (std::size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      if (!e.is_number() || !(e.get<double>() > 0.0) || !std::isfinite(e.get<double>())) {
        fail(fn_, rope::detail::indexed(path(key), i), "a finite number > 0", e.dump());
      }
      out.push_back(e.get<double>());
    }
    return out;
  }
  std::optional<std::vector<std::size_t>> count_list(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array()) bad(key, "a list of whole numbers", *v);
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      if (e.is_boolean()) {
        out.push_back(e.get<bool>() ? 1 : 0);
      } else if (e.is_number_integer() && e.get<std::int64_t>() >= 0) {
        out.push_back(static_cast<std::size_t>(e.get<std::int64_t>()));
      } else {
        fail(fn_, rope::detail::indexed(path(key), i), "a whole number >= 0", e.dump());
      }
    }
    return out;
  }

 private:
  const char* fn_;
  const Json* object_;
  std::string prefix_;
  const Json* defaults_;
};

// g(s, m) = 1 if s <= 1 else 0.1 m ln(s) + 1 (the reference's get_mscale).
inline double mscale_g(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

// What every rope entry of a model shares.
struct Context {
  const Reader* cfg = nullptr;
  Family family;
  std::size_t head_dim = 0;
  std::optional<double> top_theta;
  std::optional<double> top_partial;  // partial_rotary_factor (or rotary_pct): wins over the entry's
  std::optional<std::size_t> gptj_rotary_dim;
  std::optional<std::size_t> max_positions;
  std::optional<std::size_t> top_original;  // top-level original_max_position_embeddings (Phi-3)
  bool per_layer = false;                   // entries per layer type: no top-level original applies
};

// The pretraining length of yarn, longrope and llama3 entries: a top-level
// original_max_position_embeddings wins (single-entry configs), then the
// entry's, then max_position_embeddings.
inline std::size_t original_length(const Context& c, const Reader& e) {
  if (!c.per_layer && c.top_original) return *c.top_original;
  if (const auto v = e.positive_count("original_max_position_embeddings")) return *v;
  if (c.max_positions) return *c.max_positions;
  e.missing("original_max_position_embeddings", "or max_position_embeddings, the pretraining length");
}

// One kind of layer from its rope entry (null for a config without one).
inline LayerRope make_kind(const Context& c, const Reader& e, std::string layer_type, std::size_t head_dim) {
  const Reader& cfg = *c.cfg;
  LayerRope k;
  k.layer_type = std::move(layer_type);
  k.head_dim = head_dim;

  const bool by_type_key = !e.has("rope_type") && e.has("type");
  std::string type = e.string("rope_type").value_or(e.string("type").value_or("default"));
  const std::string type_key = by_type_key ? "type" : "rope_type";
  if (type == "mrope") type = "default";  // Qwen2-VL's legacy spelling: plain schedule, M-RoPE sections
  if (type == "su" || (c.family.phi3 && by_type_key && type == "yarn")) type = "longrope";
  k.rope_type = type;

  k.base = e.positive("rope_theta").value_or(c.top_theta.value_or(10000.0));
  if (c.family.chatglm) k.base = 10000.0 * cfg.positive("rope_ratio").value_or(1.0);

  // Partial rotary: int(head_dim * factor), the top-level key first.
  std::optional<double> partial = c.top_partial;
  std::string partial_key = cfg.has("partial_rotary_factor") ? cfg.path("partial_rotary_factor")
                                                             : cfg.path("rotary_pct");
  if (!partial) {
    partial = e.number("partial_rotary_factor");
    partial_key = e.path("partial_rotary_factor");
  }
  if (partial && !(*partial >= 0.0 && *partial <= 1.0)) {
    fail(cfg.fn(), partial_key, "in [0, 1]", to_text(*partial));
  }
  if (type == "proportional") {
    k.rotary_dim = head_dim;  // the whole head; pairs past the proportion do not turn
  } else if (c.family.chatglm) {
    k.rotary_dim = head_dim / 2;
  } else if (partial) {
    k.rotary_dim = static_cast<std::size_t>(std::trunc(static_cast<double>(head_dim) * *partial));
  } else if (c.gptj_rotary_dim) {
    k.rotary_dim = *c.gptj_rotary_dim;
    if (k.rotary_dim > head_dim) {
      fail(cfg.fn(), cfg.path("rotary_dim"), "<= head_dim = " + to_text(head_dim), k.rotary_dim);
    }
  } else {
    k.rotary_dim = head_dim;
  }
  if (k.rotary_dim == 0 || k.rotary_dim % 2 != 0) {
    fail(cfg.fn(), partial ? partial_key : cfg.path("head_dim"),
         "a value giving an even, positive rotary_dim (head_dim " + to_text(head_dim) + " gives " +
             to_text(k.rotary_dim) + ")",
         partial ? to_text(*partial) : to_text(head_dim));
  }

  const auto factor = [&](const char* why) { return e.required_positive("factor", why); };
  if (type == "default") {
    k.scaling = scaling::None{};
  } else if (type == "linear") {
    k.scaling = scaling::Linear{factor("linear scaling divides by it")};
  } else if (type == "ntk") {
    k.scaling = scaling::Ntk{factor("ntk scaling stretches the base by it")};
  } else if (type == "dynamic") {
    // The reference scales from max_position_embeddings, not from an
    // original length in the entry.
    if (!c.max_positions) cfg.missing("max_position_embeddings", "dynamic scaling starts there");
    k.scaling = scaling::DynamicNtk{factor("dynamic scaling needs it"), *c.max_positions};
  } else if (type == "yarn") {
    scaling::Yarn y;
    if (!e.present("factor")) e.missing("factor", "yarn needs it; null means max/original length");
    y.original_max_positions = original_length(c, e);
    if (const auto f = e.positive("factor")) {
      y.factor = *f;
    } else {
      if (!c.max_positions) cfg.missing("max_position_embeddings", "yarn's factor is null");
      y.factor = static_cast<double>(*c.max_positions) / static_cast<double>(y.original_max_positions);
    }
    // `beta_fast or 32`: 0 and null take the default; negatives are refused.
    for (auto [key, field, fallback] : {std::tuple<const char*, double*, double>{"beta_fast", &y.beta_fast, 32.0},
                                        std::tuple<const char*, double*, double>{"beta_slow", &y.beta_slow, 1.0}}) {
      const auto v = e.number(key);
      if (v && *v < 0.0) e.bad(key, ">= 0", *e.find(key));
      *field = v && *v != 0.0 ? *v : fallback;
    }
    // Absent mscale keys are 0: the ratio needs both truthy.
    y.mscale = e.number("mscale").value_or(0.0);
    y.mscale_all_dim = e.number("mscale_all_dim").value_or(0.0);
    y.attention_factor = e.positive("attention_factor");
    y.truncate = e.flag("truncate", true);
    if (!y.attention_factor && y.mscale != 0.0 && y.mscale_all_dim != 0.0 &&
        !(mscale_g(y.factor, y.mscale) / mscale_g(y.factor, y.mscale_all_dim) > 0.0)) {
      e.bad("mscale", "a value that keeps g(factor, mscale) / g(factor, mscale_all_dim) > 0", *e.find("mscale"));
    }
    k.scaling = y;
  } else if (type == "longrope") {
    // Phi-3.5-MoE's modeling code replaces the attention factor by
    // short_mscale / long_mscale, switching with the sequence length; rope
    // refuses those keys rather than give a wrong attention factor.
    for (const char* key : {"short_mscale", "long_mscale"}) {
      if (e.has(key)) e.bad(key, "absent (a length-dependent mscale rope does not model)", *e.find(key));
    }
    scaling::LongRope l;
    l.short_factor = e.positive_list("short_factor");
    l.long_factor = e.positive_list("long_factor");
    for (const char* key : {"short_factor", "long_factor"}) {
      const std::size_t n = e.find(key)->size();
      if (n != k.rotary_dim / 2) {
        fail(e.fn(), e.path(key), "rotary_dim/2 = " + to_text(k.rotary_dim / 2) + " numbers long",
             to_text(n) + " numbers");
      }
    }
    l.original_max_positions = original_length(c, e);
    if (l.original_max_positions < 2) {
      e.bad("original_max_position_embeddings", ">= 2 (longrope divides by its log)",
            Json(l.original_max_positions));
    }
    l.factor = e.positive("factor");
    if (!l.factor) {
      if (!c.max_positions) cfg.missing("max_position_embeddings", "longrope's factor is max/original length");
      l.max_positions = *c.max_positions;
    }
    l.attention_factor = e.positive("attention_factor");
    k.scaling = l;
  } else if (type == "llama3") {
    scaling::Llama3 l;
    l.factor = factor("llama3 needs it");
    l.low_freq_factor = e.required_positive("low_freq_factor", "llama3 needs it");
    l.high_freq_factor = e.required_positive("high_freq_factor", "llama3 needs it");
    l.original_max_positions = original_length(c, e);
    k.scaling = l;
  } else if (type == "proportional") {
    k.scaling = scaling::Proportional{partial.value_or(1.0), e.positive("factor").value_or(1.0)};
  } else {
    e.bad(type_key,
          "one of default, linear, dynamic, yarn, longrope, llama3, proportional, ntk (or the legacy su, mrope)",
          Json(type));
  }

  // Every field was checked above; frequencies() checks their combination
  // (a factor that overflows theta).
  try {
    (void)k.frequencies(0);
  } catch (const rope::invalid_argument& err) {
    fail(cfg.fn(), e.path(type_key), std::string("a setting rope::frequencies accepts (") + err.what() + ")",
         Json(type).dump());
  }
  return k;
}

// The axis of each pair from mrope_section.
inline std::optional<PairAxes> pair_axes(const Context& c, const Reader& e, std::size_t rotary_dim) {
  std::optional<std::vector<std::size_t>> s = e.count_list("mrope_section");
  if (!s && c.family.qwen3_vl) s = std::vector<std::size_t>{24, 20, 20};
  if (!s && c.family.ernie_vl) s = std::vector<std::size_t>{22, 22, 20};
  if (!s) return std::nullopt;
  const std::size_t pairs = rotary_dim / 2;
  const Json shown(*s);
  if (s->size() != 3) fail(e.fn(), e.path("mrope_section"), "three numbers (t, h, w)", shown.dump());
  const std::size_t sum = (*s)[0] + (*s)[1] + (*s)[2];
  if (sum != pairs) {
    fail(e.fn(), e.path("mrope_section"), "numbers summing to rotary_dim/2 = " + to_text(pairs), shown.dump());
  }
  if (c.family.ernie_vl) {
    // Sections are (h, w, t); h and w alternate over the first h + w pairs.
    if ((*s)[0] != (*s)[1]) fail(e.fn(), e.path("mrope_section"), "equal h and w sections", shown.dump());
    return PairAxes::hw_alternating((*s)[0] + (*s)[1], pairs);
  }
  const bool interleaved = c.family.qwen3_vl || e.flag("mrope_interleaved", false);
  try {
    return PairAxes::sections(
        MropeSections{{(*s)[0], (*s)[1], (*s)[2]}, interleaved ? SectionOrder::interleaved : SectionOrder::chunked},
        pairs);
  } catch (const rope::invalid_argument& err) {
    fail(e.fn(), e.path("mrope_section"), std::string("a layout rope can build (") + err.what() + ")", shown.dump());
  }
}

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
      m.kinds.push_back(make_kind(c, entry_reader(&*it, block_path + "." + t), t, head_dim_for(t)));
    }
    assign_by_type();
  } else if (family.gemma3 || cfg.has("rope_local_base_freq")) {
    // Gemma 3: global layers use rope_theta and the rope entry, sliding ones
    // the plain schedule at rope_local_base_freq.
    kind_names.push_back("full_attention");
    m.kinds.push_back(make_kind(c, single, "full_attention", c.head_dim));
    LayerRope local = make_kind(c, entry_reader(nullptr, ""), "sliding_attention", c.head_dim);
    local.base = cfg.required_positive("rope_local_base_freq", "sliding layers use it");
    kind_names.push_back("sliding_attention");
    m.kinds.push_back(local);
    assign_by_type();
  } else if (family.cohere2) {
    // Command R7B / A: only sliding-window layers rotate.
    kind_names.push_back("sliding_attention");
    m.kinds.push_back(make_kind(c, single, "sliding_attention", c.head_dim));
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
    m.kinds.push_back(make_kind(c, single, "", c.head_dim));
    LayerRope nope;
    nope.rotates = false;
    nope.head_dim = c.head_dim;
    m.kinds.push_back(nope);
    for (const auto f : flags) m.layer_kind.push_back(f != 0 ? 0 : 1);
  } else {
    m.kinds.push_back(make_kind(c, single, "", c.head_dim));
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
      const double g = mscale_g(factor, all_dim);
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

}  // namespace detail

// The model's RoPE from a config.json's text.
inline ModelRope parse(const std::string& text, const ParseOptions& options = {}) {
  detail::Json root;
  try {
    root = detail::Json::parse(text);
  } catch (const detail::Json::parse_error& e) {
    rope::detail::fail("rope::hf::parse", "the config text", std::string("valid JSON (") + e.what() + ")",
                       "byte " + rope::detail::to_text(e.byte));
  }
  return detail::read("rope::hf::parse", root, options);
}

// The model's RoPE from an already parsed config.
inline ModelRope from_json(const nlohmann::json& config, const ParseOptions& options = {}) {
  return detail::read("rope::hf::from_json", config, options);
}

// The model's RoPE from a config.json file.
inline ModelRope load(const std::string& path, const ParseOptions& options = {}) {
  std::ifstream in(path, std::ios::binary);
  if (!in) rope::detail::fail("rope::hf::load", "path", "a readable file", path);
  std::ostringstream text;
  text << in.rdbuf();
  detail::Json root;
  try {
    root = detail::Json::parse(text.str());
  } catch (const detail::Json::parse_error& e) {
    rope::detail::fail("rope::hf::load", path, std::string("valid JSON (") + e.what() + ")",
                       "byte " + rope::detail::to_text(e.byte));
  }
  return detail::read("rope::hf::load", root, options);
}

}  // namespace rope::hf
