// rope/hf/rope_entry.hpp — one kind of layer from its rope entry (the
// reference's standardize_rope_params and rope init functions): rope type,
// base, rotary channels and the scaling variant, read by one function per
// rope type through the table kRopeTypes. Internal to rope::hf.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../frequencies.hpp"
#include "families.hpp"
#include "model.hpp"
#include "reader.hpp"

namespace rope::hf::detail {

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
  // The reference holds the rope parameters per layer type (per_layer, or
  // Gemma 3's rope_local_base_freq folded into them): YaRN's `truncate` is
  // read from that outer dict (_compute_yarn_parameters:
  // config.rope_parameters.get("truncate", True)), never from an entry.
  bool per_layer_type_params = false;
};

// The pretraining length of yarn, longrope and llama3 entries: a top-level
// original_max_position_embeddings wins (single-entry configs), then the
// entry's, then max_position_embeddings.
inline std::size_t original_length(const Context& c, const Reader& entry) {
  if (!c.per_layer && c.top_original) return *c.top_original;
  if (const auto v = entry.positive_count("original_max_position_embeddings")) return *v;
  if (c.max_positions) return *c.max_positions;
  entry.missing("original_max_position_embeddings", "or max_position_embeddings, the pretraining length");
}

// The rope type as the reference normalises it, and the key it came from.
struct RopeType {
  std::string name;
  std::string key;  // "rope_type", or "type" (the legacy spelling) when only that is given
};

inline RopeType rope_type_of(const Context& c, const Reader& entry) {
  const bool by_type_key = !entry.has("rope_type") && entry.has("type");
  RopeType type{entry.string("rope_type").value_or(entry.string("type").value_or("default")),
                by_type_key ? "type" : "rope_type"};
  if (type.name == "mrope") type.name = "default";  // Qwen2-VL's legacy spelling: plain schedule, M-RoPE sections
  if (type.name == "su" || (c.family.phi3 && by_type_key && type.name == "yarn")) type.name = "longrope";
  return type;
}

// Partial rotary: the factor (the top-level key first) and its key path.
struct Partial {
  std::optional<double> factor;
  std::string key;
};

inline Partial partial_rotary(const Context& c, const Reader& entry) {
  const Reader& cfg = *c.cfg;
  Partial partial{c.top_partial,
                  cfg.has("partial_rotary_factor") ? cfg.path("partial_rotary_factor") : cfg.path("rotary_pct")};
  if (!partial.factor) {
    partial.factor = entry.number("partial_rotary_factor");
    partial.key = entry.path("partial_rotary_factor");
  }
  // Configurations such as Qwen3NextConfig.__post_init__ default the
  // partial_rotary_factor kwarg (0.25 there), which the rope parameters take
  // unless they hold their own.
  if (!partial.factor && c.family.default_partial > 0.0) partial.factor = c.family.default_partial;
  if (partial.factor && !(*partial.factor >= 0.0 && *partial.factor <= 1.0)) {
    fail(cfg.fn(), partial.key, "in [0, 1]", to_text(*partial.factor));
  }
  return partial;
}

// The channels rotated: int(head_dim * factor) for partial rotary; even and
// positive.
inline std::size_t rotary_dim_of(const Context& c, const std::string& type, const Partial& partial,
                                 std::size_t head_dim) {
  const Reader& cfg = *c.cfg;
  std::size_t rotary_dim = head_dim;
  if (type == "proportional") {
    rotary_dim = head_dim;  // the whole head; pairs past the proportion do not turn
  } else if (c.family.chatglm) {
    rotary_dim = head_dim / 2;
  } else if (partial.factor) {
    rotary_dim = static_cast<std::size_t>(std::trunc(static_cast<double>(head_dim) * *partial.factor));
  } else if (c.gptj_rotary_dim) {
    rotary_dim = *c.gptj_rotary_dim;
    if (rotary_dim > head_dim) {
      fail(cfg.fn(), cfg.path("rotary_dim"), {"<= head_dim = ", head_dim}, rotary_dim);
    }
  }
  if (rotary_dim == 0 || rotary_dim % 2 != 0) {
    fail(cfg.fn(), partial.factor ? partial.key : cfg.path("head_dim"),
         {"a value giving an even, positive rotary_dim (head_dim ", head_dim, " gives ", rotary_dim, ")"},
         partial.factor ? to_text(*partial.factor) : to_text(head_dim));
  }
  return rotary_dim;
}

// What the reader of one rope type sees.
struct EntryArgs {
  const Context& context;
  const Reader& entry;
  std::size_t rotary_dim;
  std::optional<double> partial;  // the partial rotary factor, when given
};

inline Scaling default_scaling(const EntryArgs&) { return scaling::None{}; }

inline Scaling linear_scaling(const EntryArgs& a) {
  return scaling::Linear{a.entry.required_positive("factor", "linear scaling divides by it")};
}

inline Scaling ntk_scaling(const EntryArgs& a) {
  return scaling::Ntk{a.entry.required_positive("factor", "ntk scaling stretches the base by it")};
}

// The reference scales from max_position_embeddings, not from an original
// length in the entry.
inline Scaling dynamic_scaling(const EntryArgs& a) {
  if (!a.context.max_positions) a.context.cfg->missing("max_position_embeddings", "dynamic scaling starts there");
  const double factor = a.entry.required_positive("factor", "dynamic scaling needs it");
  return scaling::DynamicNtk{factor, *a.context.max_positions};
}

// `beta_fast or 32`: 0 and null take the default; negatives are refused.
inline double yarn_beta(const Reader& entry, const char* key, double fallback) {
  const auto v = entry.number(key);
  if (v && *v < 0.0) entry.bad(key, ">= 0", *entry.find(key));
  return v && *v != 0.0 ? *v : fallback;
}

inline Scaling yarn_scaling(const EntryArgs& a) {
  const Reader& entry = a.entry;
  scaling::Yarn y;
  if (!entry.present("factor")) entry.missing("factor", "yarn needs it; null means max/original length");
  y.original_max_positions = original_length(a.context, entry);
  if (const auto f = entry.positive("factor")) {
    y.factor = *f;
  } else {
    if (!a.context.max_positions) a.context.cfg->missing("max_position_embeddings", "yarn's factor is null");
    y.factor = static_cast<double>(*a.context.max_positions) / static_cast<double>(y.original_max_positions);
  }
  y.beta_fast = yarn_beta(entry, "beta_fast", 32.0);
  y.beta_slow = yarn_beta(entry, "beta_slow", 1.0);
  // Absent mscale keys are 0: the ratio needs both truthy.
  y.mscale = entry.number("mscale").value_or(0.0);
  y.mscale_all_dim = entry.number("mscale_all_dim").value_or(0.0);
  y.attention_factor = entry.positive("attention_factor");
  y.truncate = a.context.per_layer_type_params ? true : entry.flag("truncate", true);
  if (!y.attention_factor && y.mscale != 0.0 && y.mscale_all_dim != 0.0 &&
      !(rope::detail::yarn_g(y.factor, y.mscale) / rope::detail::yarn_g(y.factor, y.mscale_all_dim) > 0.0L)) {
    entry.bad("mscale", "a value that keeps g(factor, mscale) / g(factor, mscale_all_dim) > 0", *entry.find("mscale"));
  }
  return y;
}

// short_factor and long_factor: rotary_dim/2 numbers > 0 each.
inline void read_longrope_factors(const Reader& entry, std::size_t rotary_dim, scaling::LongRope& l) {
  l.short_factor = entry.positive_list("short_factor");
  l.long_factor = entry.positive_list("long_factor");
  for (const char* key : {"short_factor", "long_factor"}) {
    const std::size_t n = entry.find(key)->size();
    if (n != rotary_dim / 2) {
      fail(entry.fn(), entry.path(key), {"rotary_dim/2 = ", rotary_dim / 2, " numbers long"}, to_text(n) + " numbers");
    }
  }
}

inline Scaling longrope_scaling(const EntryArgs& a) {
  const Reader& entry = a.entry;
  // Phi-3.5-MoE's modeling code replaces the attention factor by
  // short_mscale / long_mscale, switching with the sequence length; rope
  // refuses those keys rather than give a wrong attention factor.
  for (const char* key : {"short_mscale", "long_mscale"}) {
    if (entry.has(key)) entry.bad(key, "absent (a length-dependent mscale rope does not model)", *entry.find(key));
  }
  scaling::LongRope l;
  read_longrope_factors(entry, a.rotary_dim, l);
  l.original_max_positions = original_length(a.context, entry);
  if (l.original_max_positions < 2) {
    entry.bad("original_max_position_embeddings", ">= 2 (longrope divides by its log)", Json(l.original_max_positions));
  }
  l.factor = entry.positive("factor");
  if (!l.factor) {
    if (!a.context.max_positions) {
      a.context.cfg->missing("max_position_embeddings", "longrope's factor is max/original length");
    }
    l.max_positions = *a.context.max_positions;
  }
  l.attention_factor = entry.positive("attention_factor");
  return l;
}

inline Scaling llama3_scaling(const EntryArgs& a) {
  scaling::Llama3 l;
  l.factor = a.entry.required_positive("factor", "llama3 needs it");
  l.low_freq_factor = a.entry.required_positive("low_freq_factor", "llama3 needs it");
  l.high_freq_factor = a.entry.required_positive("high_freq_factor", "llama3 needs it");
  l.original_max_positions = original_length(a.context, a.entry);
  return l;
}

inline Scaling proportional_scaling(const EntryArgs& a) {
  return scaling::Proportional{a.partial.value_or(1.0), a.entry.positive("factor").value_or(1.0)};
}

// Each rope type and its reader, in the order the error for an unknown type
// lists them.
struct RopeTypeRow {
  const char* name;
  Scaling (*read)(const EntryArgs&);
};

inline constexpr RopeTypeRow kRopeTypes[] = {
    {"default", default_scaling},           {"linear", linear_scaling},
    {"dynamic", dynamic_scaling},           {"yarn", yarn_scaling},
    {"longrope", longrope_scaling},         {"llama3", llama3_scaling},
    {"proportional", proportional_scaling}, {"ntk", ntk_scaling},
};

inline Scaling scaling_of(const RopeType& type, const EntryArgs& a) {
  std::string names;
  for (const RopeTypeRow& row : kRopeTypes) {
    if (type.name == row.name) return row.read(a);
    names += (names.empty() ? "" : ", ") + std::string(row.name);
  }
  a.entry.bad(type.key, "one of " + names + " (or the legacy su, mrope)", Json(type.name));
}

// One kind of layer from its rope entry (an entry reading null for a config
// without one).
inline LayerRope read_kind(const Context& c, const Reader& entry, std::string layer_type, std::size_t head_dim) {
  LayerRope kind;
  kind.layer_type = std::move(layer_type);
  kind.head_dim = head_dim;
  const RopeType type = rope_type_of(c, entry);
  kind.rope_type = type.name;
  if (c.family.require_theta && !entry.has("rope_theta") && !c.top_theta) {
    c.cfg->missing("rope_theta", "the reference's releases default it differently for " + c.family.type);
  }
  kind.base = entry.positive("rope_theta").value_or(c.top_theta.value_or(10000.0));
  if (c.family.chatglm) kind.base = 10000.0 * c.cfg->positive("rope_ratio").value_or(1.0);
  const Partial partial = partial_rotary(c, entry);
  kind.rotary_dim = rotary_dim_of(c, type.name, partial, head_dim);
  kind.scaling = scaling_of(type, EntryArgs{c, entry, kind.rotary_dim, partial.factor});
  // Every field was checked above; frequencies() checks their combination
  // (a factor that overflows theta).
  try {
    (void)kind.frequencies(0);
  } catch (const rope::invalid_argument& err) {
    fail(c.cfg->fn(), entry.path(type.key), std::string("a setting rope::frequencies accepts (") + err.what() + ")",
         Json(type.name).dump());
  }
  return kind;
}

}  // namespace rope::hf::detail
