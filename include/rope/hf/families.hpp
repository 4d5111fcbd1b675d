// rope/hf/families.hpp — what each model family's reference code does beyond
// the shared rope utilities: its pairing and its exceptions, one row per
// model_type in one table. Internal to rope::hf; docs/hf_config.md lists the
// families.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../style.hpp"
#include "reader.hpp"

namespace rope::hf::detail {

// What a model family's reference code does beyond the shared rope utilities.
struct Family {
  std::string type;  // the family table's model_type
  Style style = Style::rotate_half;
  bool known = false;
  bool deepseek = false;       // rope part = qk_rope_head_dim channels after qk_nope_head_dim; softmax mscale^2
  bool chatglm = false;        // rotates kv_channels / 2 channels, base 10000 * rope_ratio
  bool gemma3 = false;         // Gemma3TextConfig's defaults; sliding layers use rope_local_base_freq
  bool gemma4 = false;         // full_attention layers have global_head_dim channels
  bool gemma_scalar = false;   // softmax divides by query_pre_attn_scalar
  bool unit_scale = false;     // softmax scale 1 (q, k RMS-normalised)
  bool llama4 = false;         // NoPE layers every no_rope_layer_interval-th; temperature on them
  bool cohere2 = false;        // only sliding-window layers rotate
  bool qwen3_vl = false;       // M-RoPE interleaved whatever mrope_interleaved says
  bool ernie_vl = false;       // M-RoPE: h/w alternating, then t
  bool phi3 = false;           // legacy "type": "su" / "yarn" means longrope
  bool alibi = false;          // no RoPE at all
  bool linear_nope = false;    // layer_types "linear_attention" layers are not attention: no RoPE
  bool exaone4 = false;        // with a sliding_window, only sliding-window layers rotate
  bool qwen3_next = false;     // Qwen3NextConfig's defaults: layer_types from full_attention_interval, partial 0.25
  bool nope_interval = false;  // an absent no_rope_layers is built from no_rope_layer_interval (default 4)
  bool no_rope = false;        // the attention takes no position embedding at all: refused
  bool attention_multiplier = false;  // softmax scale = attention_multiplier (default 1), Granite's muP
  bool olmo3 = false;                 // rope entry for full_attention only; sliding layers plain at rope_theta
  bool require_theta = false;         // the reference's releases default rope_theta differently: it must be given
  bool require_entry = false;         // the configuration installs its own rope entry when none is given
  bool conv_mixer = false;            // layer_types "conv" layers are short convolutions: no RoPE (LFM2)
  bool mamba_mixer = false;         // layer_types "mamba" layers: no RoPE; attention rotates by position_embedding_type
  bool gemma3n = false;             // Gemma3nTextConfig's defaults and layer pattern; scaling 1
  bool afmoe = false;               // only sliding layers rotate; pattern global_attn_every_n_layers
  bool mllama = false;              // cross_attention_layers have no self-attention and no RoPE
  bool kv_channels = false;         // head size kv_channels (JetMoE's head_dim alias)
  bool always_interleaved = false;  // MLA pairs (2p, 2p+1) whatever rope_interleave says
  bool sparse_mla = false;          // MLA with a DeepSeek Sparse Attention indexer (index_* keys)
  bool internlm2 = false;           // remote code: legacy rope_scaling {type, factor} alone, no V2PE
  bool mimo = false;                // hybrid_layer_pattern; sliding layers: swa_rope_theta, swa_head_dim
  bool indexer_interleaved = false;  // the indexer's rope pairs (2p, 2p+1); else (p, p + r/2)
  bool qwen3_5 = false;              // Qwen 3.5: Qwen3-Next's layers with interleaved M-RoPE, sections 11, 11, 10
  bool derived_head = false;         // the attention's head size is hidden_size / num_attention_heads
  double default_partial = 0;        // the configuration's default partial_rotary_factor (0: none); the entry's wins
};

// The exceptions of a family, as bits of a table row (the fields of Family).
enum Trait : std::uint64_t {
  kPlain = 0,
  kDeepseek = 1u << 0,
  kChatglm = 1u << 1,
  kGemma3 = 1u << 2,
  kGemma4 = 1u << 3,  // and unit_scale
  kGemmaScalar = 1u << 4,
  kLlama4 = 1u << 5,
  kCohere2 = 1u << 6,
  kQwen3Vl = 1u << 7,
  kErnieVl = 1u << 8,
  kPhi3 = 1u << 9,
  kAlibi = 1u << 10,  // no pairing: the family is refused
  kLinearNoPe = 1u << 11,
  kExaone4 = 1u << 12,
  kQwen3Next = 1u << 13,
  kNopeInterval = 1u << 14,
  kNoRope = 1u << 15,  // refused: no RoPE
  kAttentionMultiplier = 1u << 16,
  kOlmo3 = 1u << 17,  // and require_theta
  kInternlm2 = 1u << 18,
  kRequireEntry = 1u << 19,
  kConvMixer = 1u << 20,
  kMambaMixer = 1u << 21,
  kGemma3n = 1u << 22,  // and unit_scale
  kAfmoe = 1u << 23,
  kMllama = 1u << 24,
  kKvChannels = 1u << 25,
  kAlwaysInterleaved = 1u << 26,  // with kDeepseek
  kQwen3_5 = 1u << 27,            // and the Qwen3-Next traits
  kDerivedHead = 1u << 28,        // head size hidden_size / num_attention_heads: a head_dim key must agree
  kThetaRequired = 1u << 29,      // the releases default rope_theta differently: it must be given
  kMimo = 1u << 30,
  kSparseMla = 1ull << 32,           // with kDeepseek: an indexer whose rope rotates halves (p, p + r/2)
  kIndexerInterleaved = 1ull << 33,  // with kSparseMla: the indexer's rope pairs (2p, 2p+1)
};

struct FamilyRow {
  const char* model_type;
  Style style;
  std::uint64_t traits;
};

constexpr Style kHalf = Style::rotate_half;
constexpr Style kBlock = Style::block_diagonal;

// The pairing of each family, from its modeling code (docs/hf_config.md).
// The plain rotate_half rows follow apply_rotary_pos_emb + rotate_half of
// their own modeling_<family>.py (cat(-x2, x1) over the two halves); every
// other row cites the function its pairing or exception is read from.
inline constexpr FamilyRow kFamilies[] = {
    // block_diagonal: pair p = channels (2p, 2p + 1).
    {"gptj", kBlock, kPlain},     // modeling_gptj rotate_every_two
    {"codegen", kBlock, kPlain},  // modeling_codegen rotate_every_two
    {"cohere", kBlock, kPlain},   // modeling_cohere rotate_half over x[..., ::2], x[..., 1::2]
    // modeling_cohere2 likewise; Cohere2Attention rotates only where sliding_window is set.
    {"cohere2", kBlock, kCohere2 | kDerivedHead},  // Cohere2Config.__post_init__ sets head_dim itself
    // modeling_glm / modeling_glm4 / modeling_glm4v rotate_half_llm over 0::2 / 1::2, cos/sin repeat_interleave.
    {"glm", kBlock, kPlain},
    {"glm4", kBlock, kPlain},
    {"glm4v", kBlock, kPlain},
    {"glm4v_text", kBlock, kPlain},
    // Remote code modeling_chatglm apply_rotary_pos_emb: x.reshape(..., r/2, 2) over half of kv_channels.
    {"chatglm", kBlock, kChatglm},
    {"deepseek_v2", kBlock, kDeepseek},  // modeling_deepseek_v2 apply_rotary_emb: view_as_complex
    // modeling_deepseek_v3 apply_rotary_pos_emb_interleave (rope_interleave, the default).
    {"deepseek_v3", kBlock, kDeepseek},
    // modeling_llama4 apply_rotary_emb: view_as_complex with freqs_cis; Llama4TextConfig builds no_rope_layers.
    {"llama4", kBlock, kLlama4},
    {"llama4_text", kBlock, kLlama4},
    // modeling_ernie4_5 / modeling_ernie4_5_moe rotate_half over 0::2 / 1::2, cos/sin repeat_interleave.
    {"ernie4_5", kBlock, kPlain},
    {"ernie4_5_moe", kBlock, kPlain},
    // modeling_ernie4_5_vl_moe: the same pairing; its M-RoPE alternates h / w pairs, then t.
    {"ernie4_5_vl_moe", kBlock, kErnieVl},
    {"ernie4_5_vl_moe_text", kBlock, kErnieVl},
    {"helium", kBlock, kPlain},  // modeling_helium rotate_half over x[..., 0::2], x[..., 1::2]
    // MLA with apply_rotary_pos_emb_interleave: GLM-4.7-Flash follows rope_interleave (default true);
    // DeepseekV32Attention always interleaves its main attention, DeepseekV32Indexer rotates halves.
    {"glm4_moe_lite", kBlock, kDeepseek},
    {"deepseek_v32", kBlock, kDeepseek | kAlwaysInterleaved | kSparseMla},
    // GlmMoeDsaAttention and GlmMoeDsaIndexer: apply_rotary_pos_emb_interleave in both (its first
    // release rotated halves in both; docs/hf_config.md says why rope reads the later one).
    {"glm_moe_dsa", kBlock, kDeepseek | kAlwaysInterleaved | kSparseMla | kIndexerInterleaved},
    // rotate_half: pair p = channels (p, p + r/2).
    {"llama", kHalf, kPlain},
    {"mistral", kHalf, kPlain},
    {"mixtral", kHalf, kPlain},
    {"ministral", kHalf, kPlain},
    {"ministral3", kHalf, kRequireEntry},  // Ministral3Config installs a yarn entry of its own
    {"mistral3", kHalf, kPlain},
    {"qwen2", kHalf, kPlain},
    {"qwen2_moe", kHalf, kPlain},
    {"qwen3", kHalf, kPlain},
    {"qwen3_moe", kHalf, kPlain},
    // Qwen3NextDecoderLayer: linear_attn takes no position embeddings; Qwen3NextConfig.__post_init__ defaults.
    {"qwen3_next", kHalf, kLinearNoPe | kQwen3Next},
    {"qwen2_vl", kHalf, kPlain},
    {"qwen2_vl_text", kHalf, kPlain},
    {"qwen2_5_vl", kHalf, kPlain},
    {"qwen2_5_vl_text", kHalf, kPlain},
    // modeling_qwen3_vl Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope: M-RoPE always interleaved.
    // Qwen3VLTextConfig's default rope_theta moved between releases (5e6, 5e5): it must be given.
    {"qwen3_vl", kHalf, kQwen3Vl | kThetaRequired},
    {"qwen3_vl_text", kHalf, kQwen3Vl | kThetaRequired},
    {"qwen3_vl_moe", kHalf, kQwen3Vl | kThetaRequired},
    {"qwen3_vl_moe_text", kHalf, kQwen3Vl | kThetaRequired},
    {"gemma", kHalf, kPlain},
    {"gemma2", kHalf, kGemmaScalar},  // Gemma2Attention: scaling = query_pre_attn_scalar ** -0.5
    // Gemma3TextConfig defaults, rope_local_base_freq for sliding layers; Gemma3Attention's query_pre_attn_scalar.
    {"gemma3", kHalf, kGemma3 | kGemmaScalar},
    {"gemma3_text", kHalf, kGemma3 | kGemmaScalar},
    // Gemma4TextAttention: global_head_dim on full_attention layers, scaling = 1.0.
    {"gemma4", kHalf, kGemma4},
    {"gemma4_text", kHalf, kGemma4},
    // Gemma3nTextConfig: rope_local_base_freq for sliding layers, every 5th layer full; Gemma3nTextAttention scaling 1.
    {"gemma3n", kHalf, kGemma3n},
    {"gemma3n_text", kHalf, kGemma3n},
    {"vaultgemma", kHalf, kGemmaScalar},  // VaultGemmaAttention: scaling = query_pre_attn_scalar ** -0.5
    // Qwen3_5TextConfig.__post_init__: Qwen3-Next's layer_types and partial 0.25; recomposition_frequencies
    // interleaves M-RoPE sections (default 11, 11, 10).
    {"qwen3_5", kHalf, kQwen3_5},
    {"qwen3_5_text", kHalf, kQwen3_5},
    {"qwen3_5_moe", kHalf, kQwen3_5},
    {"qwen3_5_moe_text", kHalf, kQwen3_5},
    {"phi", kHalf, kPlain},
    {"phi3", kHalf, kPhi3},  // Phi3Config: a legacy "type" of "su" / "yarn" is longrope
    {"phimoe", kHalf, kPlain},
    {"gpt_neox", kHalf, kDerivedHead},  // GPTNeoXAttention: head_size = hidden_size // num_attention_heads
    // modeling_gpt_oss _apply_rotary_emb: torch.chunk halves, the same pairing; GptOssConfig installs a
    // yarn entry of its own.
    {"gpt_oss", kHalf, kRequireEntry},
    {"glm4_moe", kHalf, kPlain},
    {"glm4v_moe", kHalf, kPlain},
    {"glm4v_moe_text", kHalf, kPlain},
    {"stablelm", kHalf, kDerivedHead},
    {"starcoder2", kHalf, kPlain},
    {"falcon", kHalf, kDerivedHead},
    {"olmo", kHalf, kPlain},
    {"olmo2", kHalf, kPlain},
    // GraniteAttention (and its MoE variants): scaling = config.attention_multiplier.
    {"granite", kHalf, kAttentionMultiplier},
    {"granitemoe", kHalf, kAttentionMultiplier},
    {"granitemoeshared", kHalf, kAttentionMultiplier},
    // GraniteMoeHybridModel: mamba layers, and a rotary embedding only if position_embedding_type == "rope".
    {"granitemoehybrid", kHalf, kAttentionMultiplier | kMambaMixer},
    // Olmo3RotaryEmbedding per layer type: rope_scaling merged into full_attention alone.
    {"olmo3", kHalf, kOlmo3},
    {"flex_olmo", kHalf, kPlain},  // FlexOlmoConfig default_theta 500000
    {"bitnet", kHalf, kPlain},     // BitNetConfig default_theta 500000
    // Lfm2DecoderLayer: only full_attention layers attend (conv layers are short convolutions).
    {"lfm2", kHalf, kConvMixer},
    {"lfm2_moe", kHalf, kConvMixer},
    {"afmoe", kHalf, kAfmoe},         // AfmoeAttention.forward: RoPE only if self.is_local_attention
    {"exaone_moe", kHalf, kExaone4},  // ExaoneMoeAttention: sliding_window is None or is_sliding
    // MllamaTextCrossAttention layers (cross_attention_layers) take no RoPE; self-attention layers do.
    {"mllama", kHalf, kMllama},
    {"mllama_text_model", kHalf, kMllama},
    {"jetmoe", kHalf, kKvChannels},  // JetMoeAttention: head size kv_channels (attribute_map head_dim)
    {"seed_oss", kHalf, kPlain},
    {"arcee", kHalf, kPlain},
    {"dots1", kHalf, kPlain},
    // ApertusConfig / CwmConfig.__post_init__ install a llama3 rope entry of their own when none is given.
    {"apertus", kHalf, kRequireEntry},
    {"cwm", kHalf, kRequireEntry},
    {"olmoe", kHalf, kPlain},
    {"persimmon", kHalf, kDerivedHead | kThetaRequired},  // default rope_theta 25000, later 10000
    {"smollm3", kHalf, kNopeInterval},                    // SmolLM3Attention: use_rope = no_rope_layers[layer_idx]
    {"exaone4", kHalf, kExaone4},  // Exaone4Attention.forward: sliding_window is None or is_sliding
    // Remote code (InternVL's and InternLM's modeling_internlm2.py): rotate_half over the whole head of
    // hidden_size // num_attention_heads; InternLM2Config validates a legacy {type, factor} rope_scaling.
    {"internlm2", kHalf, kInternlm2 | kDerivedHead},
    // MiMo-V2-Flash, as vLLM's and SGLang's MiMoV2Attention rotate it (get_rope, neox style over
    // int(head_dim * partial_rotary_factor) channels); docs/hf_config.md says where its own modeling code differs.
    {"mimo_v2_flash", kHalf, kMimo},
    // ALiBi instead of RoPE: refused.
    {"bloom", kHalf, kAlibi},
    {"mpt", kHalf, kAlibi},
    // No position embedding in any attention layer (JambaAttention, NemotronHAttention, ZambaAttention): refused.
    {"jamba", kHalf, kNoRope},
    {"nemotron_h", kHalf, kNoRope},
    {"zamba", kHalf, kNoRope},
};

// The partial_rotary_factor a family's configuration sets as a default
// (kwargs.setdefault), which a rope entry's own value overrides; 0 for none.
inline double default_partial_rotary(const std::string& family) {
  if (family == "qwen3_next" || family.rfind("qwen3_5", 0) == 0 || family == "stablelm" || family == "gpt_neox") {
    return 0.25;
  }
  if (family == "phi" || family == "glm" || family == "glm4" || family == "glm4_moe" || family == "persimmon")
    return 0.5;
  return 0.0;
}

inline Family family_from_row(const FamilyRow& row) {
  Family f;
  const auto has = [&row](std::uint64_t trait) { return (row.traits & trait) != 0; };
  f.type = row.model_type;
  f.style = row.style;
  f.known = !has(kAlibi);
  f.deepseek = has(kDeepseek);
  f.chatglm = has(kChatglm);
  f.gemma3 = has(kGemma3);
  f.gemma4 = has(kGemma4);
  f.gemma_scalar = has(kGemmaScalar);
  f.unit_scale = has(kGemma4);
  f.llama4 = has(kLlama4);
  f.cohere2 = has(kCohere2);
  f.qwen3_vl = has(kQwen3Vl);
  f.ernie_vl = has(kErnieVl);
  f.phi3 = has(kPhi3);
  f.alibi = has(kAlibi);
  f.linear_nope = has(kLinearNoPe);
  f.exaone4 = has(kExaone4);
  f.qwen3_next = has(kQwen3Next);
  f.nope_interval = has(kNopeInterval) || has(kLlama4);
  f.no_rope = has(kNoRope);
  f.known = f.known && !f.no_rope;
  f.attention_multiplier = has(kAttentionMultiplier);
  f.olmo3 = has(kOlmo3);
  f.require_theta = has(kOlmo3) || has(kThetaRequired);
  f.derived_head = has(kDerivedHead) || has(kMllama);
  f.default_partial = default_partial_rotary(f.type);
  f.require_entry = has(kRequireEntry);
  f.conv_mixer = has(kConvMixer);
  f.mamba_mixer = has(kMambaMixer);
  f.gemma3n = has(kGemma3n);
  f.unit_scale = f.unit_scale || f.gemma3n;
  f.afmoe = has(kAfmoe);
  f.mllama = has(kMllama);
  f.kv_channels = has(kKvChannels);
  f.always_interleaved = has(kAlwaysInterleaved);
  f.sparse_mla = has(kSparseMla);
  f.internlm2 = has(kInternlm2);
  f.mimo = has(kMimo);
  f.indexer_interleaved = has(kIndexerInterleaved);
  f.qwen3_5 = has(kQwen3_5);
  f.qwen3_next = f.qwen3_next || f.qwen3_5;
  f.linear_nope = f.linear_nope || f.qwen3_5;
  return f;
}

// The row of a model_type, or null when the table has none.
inline const FamilyRow* family_row(const std::string& model_type) {
  for (const FamilyRow& row : kFamilies) {
    if (model_type == row.model_type) return &row;
  }
  return nullptr;
}

// The family an architectures entry names, as the reference's class names
// spell them: DeepseekV3ForCausalLM is deepseek_v3, Qwen3NextForCausalLM
// qwen3_next, Ernie4_5_MoeForCausalLM ernie4_5_moe (the class name without
// its head suffix, lower case, matched with the type's underscores dropped).
// Null when no row matches.
inline const FamilyRow* family_of_architecture(const std::string& architecture) {
  std::string stem = architecture;
  for (const char* suffix : {"ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model"}) {
    const std::string s(suffix);
    if (stem.size() > s.size() && stem.compare(stem.size() - s.size(), s.size(), s) == 0) {
      stem.resize(stem.size() - s.size());
      break;
    }
  }
  std::string key;
  for (const char ch : stem) {
    if (ch != '_') key += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  }
  for (const FamilyRow& row : kFamilies) {
    std::string name;
    for (const char* p = row.model_type; *p != '\0'; ++p) {
      if (*p != '_') name += *p;
    }
    if (!key.empty() && key == name) return &row;
  }
  return nullptr;
}

// The layer types a family's modeling code tells apart, when it does (a
// config naming another is refused); null: the family reads layer_types for
// its attention masks only, and every named type rotates alike.
inline const std::vector<std::string>* known_layer_types(const Family& f, bool local_base) {
  static const std::vector<std::string> sliding = {"full_attention", "sliding_attention"};
  static const std::vector<std::string> linear = {"full_attention", "linear_attention"};
  static const std::vector<std::string> conv = {"full_attention", "conv"};
  // GraniteMoeHybrid's own names, and the names its newer configuration remaps them to.
  static const std::vector<std::string> mamba = {"attention", "mamba", "full_attention", "linear_attention"};
  if (f.linear_nope) return &linear;
  if (f.conv_mixer) return &conv;
  if (f.mamba_mixer) return &mamba;
  if (f.cohere2 || f.exaone4 || f.gemma3 || f.gemma3n || f.afmoe || f.olmo3 || f.mimo || local_base) return &sliding;
  return nullptr;
}

// Gemma3TextConfig's defaults, which the reference fills in for keys a
// config omits (Gemma 3's multimodal configs give a text_config of a few
// keys only).
inline const Json& gemma3_defaults() {
  static const Json d = {
      {"rope_theta", 1000000.0}, {"rope_local_base_freq", 10000.0},   {"sliding_window_pattern", 6},
      {"head_dim", 256},         {"num_attention_heads", 8},          {"hidden_size", 2304},
      {"num_hidden_layers", 26}, {"max_position_embeddings", 131072}, {"query_pre_attn_scalar", 256}};
  return d;
}

// The class defaults of the keys rope reads, for the families whose
// configuration class defaults them otherwise than the shared rope utilities
// (rope_theta 10000, head_dim = hidden_size / num_attention_heads): each
// configuration_<family>.py's field defaults and default_theta. Null for the
// others.
inline const Json* family_defaults(const std::string& family) {
  struct Row {
    const char* types;  // the model types, space-separated
    Json keys;
  };
  static const Row rows[] = {
      {"gemma3n gemma3n_text",
       {{"rope_theta", 1e6}, {"rope_local_base_freq", 1e4}, {"head_dim", 256}, {"max_position_embeddings", 32768}}},
      {"mixtral phimoe qwen2_vl qwen2_vl_text qwen2_5_vl qwen2_5_vl_text lfm2 lfm2_moe", {{"rope_theta", 1e6}}},
      {"ministral3 cwm", {{"head_dim", 128}, {"rope_theta", 1e6}}},
      {"flex_olmo bitnet cohere ernie4_5_moe", {{"rope_theta", 5e5}}},
      {"ernie4_5 llama4 llama4_text", {{"head_dim", 128}, {"rope_theta", 5e5}}},
      {"mllama mllama_text_model", {{"rope_theta", 5e5}, {"cross_attention_layers", {3, 8, 13, 18, 23, 28, 33, 38}}}},
      {"smollm3", {{"rope_theta", 2e6}}},
      {"helium", {{"head_dim", 128}, {"rope_theta", 1e5}}},
      {"gpt_oss", {{"head_dim", 64}, {"rope_theta", 150000.0}}},
      {"apertus", {{"rope_theta", 1.2e7}}},
      {"qwen3 qwen3_vl qwen3_vl_text glm glm4 seed_oss afmoe", {{"head_dim", 128}}},
      {"jetmoe", {{"kv_channels", 128}}},
      {"gemma", {{"head_dim", 256}}},
      {"gemma2 vaultgemma", {{"head_dim", 256}, {"query_pre_attn_scalar", 256}}},
      {"gemma4 gemma4_text", {{"head_dim", 256}, {"global_head_dim", 512}}},
      {"internlm2",
       {{"hidden_size", 4096},
        {"num_attention_heads", 32},
        {"num_hidden_layers", 32},
        {"max_position_embeddings", 2048}}},
      {"qwen3_next qwen3_5 qwen3_5_text qwen3_5_moe qwen3_5_moe_text", {{"head_dim", 256}}},
  };
  if (family == "gemma3" || family == "gemma3_text") return &gemma3_defaults();
  for (const Row& row : rows) {
    const std::string types = std::string(" ") + row.types + " ";
    if (types.find(" " + family + " ") != std::string::npos) return &row.keys;
  }
  return nullptr;
}

}  // namespace rope::hf::detail
