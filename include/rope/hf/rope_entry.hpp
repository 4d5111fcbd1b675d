// rope/hf/rope_entry.hpp — one kind of layer from its rope entry (the
// reference's standardize_rope_params and rope init functions): rope type,
// base, rotary channels and the scaling variant. Internal to rope::hf.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../frequencies.hpp"
#include "families.hpp"
#include "model.hpp"
#include "reader.hpp"

namespace rope::hf::detail {

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

}  // namespace rope::hf::detail
