// rope/hf/families.hpp — what each model family's reference code does beyond
// the shared rope utilities: its pairing and its exceptions. Internal to
// rope::hf; docs/hf_config.md lists the families.
#pragma once

#include <initializer_list>
#include <string>

#include "../style.hpp"
#include "reader.hpp"

namespace rope::hf::detail {

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

}  // namespace rope::hf::detail
