// rope/hf/remote_families.hpp — the families whose modeling code ships with
// their checkpoints rather than with the reference library: what their
// configuration and attention code accept, refused by key where rope would
// read something else (InternLM2) or where that code and the serving
// implementations read a config differently (MiMo-V2-Flash). Internal to
// rope::hf.
#pragma once

#include <cstddef>
#include <string>

#include "layers.hpp"
#include "reader.hpp"

namespace rope::hf::detail {

// InternLM2Config._rope_scaling_validation: rope_scaling is null, or an
// object of exactly two fields, type ("linear" or "dynamic") and a float
// factor >= 1 (an integer is refused there: isinstance(factor, float)).
inline void internlm2_rope_scaling(const Config& config) {
  const Reader& cfg = config.cfg();
  if (!cfg.present("rope_scaling") || cfg.object()->at("rope_scaling").is_null()) return;
  const Json& block = cfg.object()->at("rope_scaling");
  if (!block.is_object() || block.size() != 2 || !block.contains("type") || !block.contains("factor")) {
    cfg.bad("rope_scaling", "null or {\"type\": ..., \"factor\": ...} alone (InternLM2Config's check)", block);
  }
  const Reader entry = config.entry(&block, cfg.path("rope_scaling"));
  const Json& type = block.at("type");
  if (!type.is_string() || (type.get<std::string>() != "linear" && type.get<std::string>() != "dynamic")) {
    entry.bad("type", "\"linear\" or \"dynamic\" (InternLM2's scalings)", type);
  }
  const Json& factor = block.at("factor");
  if (!factor.is_number_float() || !(factor.get<double>() >= 1.0)) {
    entry.bad("factor", "a float >= 1 (InternLM2Config checks isinstance(factor, float))", factor);
  }
}

// InternLM2 (InternVL2's language model): the remote InternLM2Config reads
// rope_theta and rope_scaling alone; rope_pos_id_version "v2pe" replaces the
// rotary embedding by V2PE's, whose positions step by fractions rope does
// not take; InternLM2Attention raises unless hidden_size divides into
// num_attention_heads heads.
inline void internlm2_keys(const Config& config) {
  const Reader& cfg = config.cfg();
  if (cfg.present("rope_parameters") && !cfg.object()->at("rope_parameters").is_null()) {
    cfg.bad("rope_parameters", "absent (InternLM2Config reads rope_theta and rope_scaling only)",
            cfg.object()->at("rope_parameters"));
  }
  internlm2_rope_scaling(config);
  if (const Json* version = cfg.find("rope_pos_id_version"); version != nullptr && *version == "v2pe") {
    cfg.bad("rope_pos_id_version", "not \"v2pe\" (V2PE's rotary embedding and fractional positions)", *version);
  }
  const std::size_t hidden = cfg.positive_count("hidden_size").value_or(0);
  const std::size_t heads = cfg.positive_count("num_attention_heads").value_or(0);
  if (heads != 0 && hidden % heads != 0) {
    fail(cfg.fn(), cfg.path("hidden_size"),
         {"a multiple of num_attention_heads = ", heads, " (InternLM2Attention raises otherwise)"}, hidden);
  }
}

// MiMo-V2-Flash: the keys its implementations read alike only when given.
// A rope entry is ignored by vLLM and by the modeling code's rotary
// embedding (which reads a top-level rope_type instead) and applied by
// SGLang; rope_theta, partial_rotary_factor and num_hidden_layers default
// differently in the checkpoint's configuration (10000, 1, 32) and in
// transformers' port (5e6, 0.334, 48); the attention reads head_dim without
// a default.
inline void mimo_keys(const Config& config) {
  const Reader& cfg = config.cfg();
  for (const char* key : {"rope_scaling", "rope_parameters", "rope_type"}) {
    if (cfg.has(key)) {
      cfg.bad(key, "absent (MiMo-V2-Flash's implementations disagree on a rope entry: vLLM ignores it)",
              *cfg.find(key));
    }
  }
  for (const char* key : {"head_dim", "rope_theta", "partial_rotary_factor"}) {
    if (!cfg.has(key)) cfg.missing(key, "MiMo-V2-Flash's implementations default it differently, or not at all");
  }
}

}  // namespace rope::hf::detail
