#!/usr/bin/env python3
"""Expected RoPE values for the checkpoint configs in configs/.

An independent reference for rope's config reader (include/rope/hf_config.hpp),
written in Python from the published formulas of the Hugging Face
implementation (modeling_rope_utils and each family's modeling code), in the
shape that code has: the config is first standardised into one parameter
dict per layer type, then each rope type's own function turns a dict into
inv_freq and an attention factor. It does not read rope's sources. Run it to
regenerate expected.json:

    python3 tests/data/hf/reference.py

For every config it writes the pairing, the rotary channels, the softmax
scale, the M-RoPE axis of each pair, and at a few (layer, seq_len) probes
whether the layer rotates, its head and rotary sizes, inv_freq and the
attention factor; plus the query scale at a few (layer, position) probes.
Everything is float64 (Python floats), as the reference computes with
float64 inputs; rope's test compares at 1e-12 relative.
"""
import argparse
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "configs")
DEFAULT_THETA = 10000.0

# The pairing each family's modeling code applies, derived from how its
# rotation function pairs channels rather than listed by pairing:
#   "rotate_half"       x1 = x[..., : d/2], x2 = x[..., d/2 :], cat(-x2, x1):
#                       pair p is channels (p, p + r/2)  -> "rotate_half"
#   "rotate_every_two"  x1 = x[..., ::2], x2 = x[..., 1::2], stack(-x2, x1)
#                       flattened: pair p is (2p, 2p + 1) -> "block_diagonal"
#   "complex"           view_as_complex over adjacent channels (torch.polar
#                       freqs_cis): pair p is (2p, 2p + 1) -> "block_diagonal"
#   "repeat_interleave" cos/sin repeat_interleave(2) with a rotate_half over
#                       x[..., 0::2] / x[..., 1::2]: (2p, 2p + 1)
#   "deinterleave"      q.view(..., r/2, 2).transpose(-1, -2) then rotate_half:
#                       the rotated halves are the even and odd channels, so
#                       pair p is (2p, 2p + 1) of the original layout
ROTATION_PAIRING = {"rotate_half": "rotate_half", "rotate_every_two": "block_diagonal",
                    "complex": "block_diagonal", "repeat_interleave": "block_diagonal",
                    "deinterleave": "block_diagonal"}
# Family -> the rotation its modeling_<family>.py applies (the function read).
ROTATION_OF_FAMILY = {
    # modeling_chatglm (remote code) apply_rotary_pos_emb: x.reshape(..., r/2, 2) pairs adjacent channels.
    "chatglm": "rotate_every_two",
    # modeling_codegen / modeling_gptj rotate_every_two.
    "codegen": "rotate_every_two", "gptj": "rotate_every_two",
    # modeling_cohere / modeling_cohere2 rotate_half: x[..., ::2], x[..., 1::2], stack, flatten.
    "cohere": "rotate_every_two", "cohere2": "rotate_every_two",
    # modeling_deepseek_v2 apply_rotary_emb: view_as_complex(reshape(..., -1, 2)).
    "deepseek_v2": "complex",
    # modeling_deepseek_v3 apply_rotary_pos_emb_interleave (rope_interleave, the default).
    "deepseek_v3": "deinterleave",
    # modeling_ernie4_5 / modeling_ernie4_5_moe / modeling_ernie4_5_vl_moe rotate_half_text over 0::2 / 1::2.
    "ernie4_5": "repeat_interleave", "ernie4_5_moe": "repeat_interleave",
    "ernie4_5_vl_moe": "repeat_interleave", "ernie4_5_vl_moe_text": "repeat_interleave",
    # modeling_glm / modeling_glm4 / modeling_glm4v rotate_half_llm over 0::2 / 1::2 with repeat_interleave.
    "glm": "repeat_interleave", "glm4": "repeat_interleave", "glm4v": "repeat_interleave",
    "glm4v_text": "repeat_interleave",
    # modeling_helium rotate_half over x[..., 0::2] / x[..., 1::2].
    "helium": "repeat_interleave",
    # modeling_llama4 apply_rotary_emb: view_as_complex, freqs_cis.
    "llama4": "complex", "llama4_text": "complex",
    # modeling_glm4_moe_lite (rope_interleave, default true) and modeling_deepseek_v32 (always, for the main
    # attention): apply_rotary_pos_emb_interleave.
    "glm4_moe_lite": "deinterleave", "deepseek_v32": "deinterleave",
    # modeling_glm_moe_dsa GlmMoeDsaAttention (the release after the first): apply_rotary_pos_emb_interleave.
    "glm_moe_dsa": "deinterleave",
}
# Every other family covered uses the llama-style rotate_half of its own
# modeling file (modeling_<family>.rotate_half: cat(-x2, x1)).
HALF_FAMILIES = {
    "exaone4", "falcon", "gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text", "glm4_moe",
    "glm4v_moe", "glm4v_moe_text", "gpt_neox", "gpt_oss", "granite", "granitemoe", "llama", "ministral",
    "ministral3", "mistral", "mistral3", "mixtral", "olmo", "olmo2", "olmoe", "persimmon", "phi", "phi3", "phimoe",
    "qwen2", "qwen2_5_vl", "qwen2_5_vl_text", "qwen2_moe", "qwen2_vl", "qwen2_vl_text", "qwen3", "qwen3_moe",
    "qwen3_next", "qwen3_vl", "qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_vl_text", "smollm3", "stablelm",
    "starcoder2",
    # Read for this release: each modeling file's rotate_half (cat(-x2, x1)).
    "gemma3n", "gemma3n_text", "vaultgemma", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
    "granitemoeshared", "granitemoehybrid", "olmo3", "flex_olmo", "bitnet", "lfm2", "lfm2_moe",
    "afmoe", "exaone_moe", "mllama", "mllama_text_model", "jetmoe", "seed_oss", "arcee", "dots1", "apertus",
    "cwm",
    # Remote code shipped with the checkpoints: InternVL's / InternLM's modeling_internlm2.py rotate_half.
    "internlm2",
    # vLLM's and SGLang's MiMoV2Attention: get_rope with the default neox style over
    # int(head_dim * partial_rotary_factor) channels, the inv_freq of that many channels.
    "mimo_v2_flash",
}
# MLA families: rotary part qk_rope_head_dim channels after qk_nope_head_dim.
MLA_FAMILIES = {"deepseek_v2", "deepseek_v3", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa"}
# MLA families whose main attention interleaves whatever rope_interleave says.
ALWAYS_INTERLEAVED = {"deepseek_v32", "glm_moe_dsa"}
# Sparse MLA (DeepSeek Sparse Attention): the rotation the indexer applies to the first qk_rope_head_dim
# channels of its q and k heads. DeepseekV32Indexer (and DeepSeek's reference Indexer, apply_rotary_emb
# with interleaved=False) rotates halves; GlmMoeDsaIndexer calls apply_rotary_pos_emb_interleave.
INDEXER_ROTATION = {"deepseek_v32": "rotate_half", "glm_moe_dsa": "deinterleave"}
QWEN3_NEXT_LAYERS = {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
GRANITE = {"granite", "granitemoe", "granitemoeshared", "granitemoehybrid"}
for _family in HALF_FAMILIES:
    ROTATION_OF_FAMILY.setdefault(_family, "rotate_half")


def pairing_of(family):
    return ROTATION_PAIRING[ROTATION_OF_FAMILY[family]]


def family_of_architecture(name):
    """The family an architectures class names (DeepseekV3ForCausalLM -> deepseek_v3)."""
    for suffix in ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    key = name.replace("_", "").lower()
    for family in ROTATION_OF_FAMILY:
        if family.replace("_", "") == key:
            return family
    return None


# Gemma3TextConfig.__init__ defaults, used for keys its config omits.
GEMMA3_TEXT_DEFAULTS = {
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window_pattern": 6, "head_dim": 256,
    "num_attention_heads": 8, "hidden_size": 2304, "num_hidden_layers": 26, "max_position_embeddings": 131_072,
    "query_pre_attn_scalar": 256,
}
# Other configuration classes' defaults that differ from the shared ones (default_theta 10000).
CLASS_DEFAULTS = {
    # Each configuration_<family>.py: field defaults and default_theta, where they differ from head_dim =
    # hidden_size // num_attention_heads and rope_theta 10000.
    "gemma3n_text": {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "head_dim": 256, "max_position_embeddings": 32768},
    "mixtral": {"rope_theta": 1e6}, "phimoe": {"rope_theta": 1e6}, "qwen2_vl_text": {"rope_theta": 1e6},
    "lfm2": {"rope_theta": 1e6}, "lfm2_moe": {"rope_theta": 1e6},
    "ministral3": {"head_dim": 128, "rope_theta": 1e6}, "cwm": {"head_dim": 128, "rope_theta": 1e6},
    "flex_olmo": {"rope_theta": 5e5}, "bitnet": {"rope_theta": 5e5}, "cohere": {"rope_theta": 5e5},
    "ernie4_5_moe": {"rope_theta": 5e5}, "ernie4_5": {"head_dim": 128, "rope_theta": 5e5},
    "llama4_text": {"head_dim": 128, "rope_theta": 5e5},
    "mllama_text_model": {"rope_theta": 5e5, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]},
    "smollm3": {"rope_theta": 2e6}, "helium": {"head_dim": 128, "rope_theta": 1e5},
    "gpt_oss": {"head_dim": 64, "rope_theta": 1.5e5}, "apertus": {"rope_theta": 1.2e7},
    "qwen3": {"head_dim": 128}, "qwen3_vl_text": {"head_dim": 128}, "glm": {"head_dim": 128},
    "glm4": {"head_dim": 128}, "seed_oss": {"head_dim": 128}, "afmoe": {"head_dim": 128},
    "jetmoe": {"kv_channels": 128}, "gemma": {"head_dim": 256},
    "gemma2": {"head_dim": 256, "query_pre_attn_scalar": 256},
    "vaultgemma": {"head_dim": 256, "query_pre_attn_scalar": 256},
    "gemma4_text": {"head_dim": 256, "global_head_dim": 512},
    "qwen3_next": {"head_dim": 256}, "qwen3_5_text": {"head_dim": 256},
    # The remote InternLM2Config's __init__ defaults.
    "internlm2": {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
                  "max_position_embeddings": 2048},
}
# Composite and text model types share their text configuration's defaults.
for _a, _b in (("gemma3n", "gemma3n_text"), ("mllama", "mllama_text_model"), ("qwen3_5", "qwen3_5_text"),
               ("qwen3_5_moe", "qwen3_5_text"), ("qwen3_5_moe_text", "qwen3_5_text"), ("qwen2_vl", "qwen2_vl_text"),
               ("qwen2_5_vl", "qwen2_vl_text"), ("qwen2_5_vl_text", "qwen2_vl_text"), ("qwen3_vl", "qwen3_vl_text"),
               ("llama4", "llama4_text"), ("gemma4", "gemma4_text")):
    CLASS_DEFAULTS[_a] = CLASS_DEFAULTS[_b]
# kwargs.setdefault("partial_rotary_factor", ...) of each configuration: the rope parameters keep their own.
DEFAULT_PARTIAL = {"qwen3_next": 0.25, "qwen3_5": 0.25, "qwen3_5_text": 0.25, "qwen3_5_moe": 0.25,
                   "qwen3_5_moe_text": 0.25, "stablelm": 0.25, "gpt_neox": 0.25, "phi": 0.5, "glm": 0.5, "glm4": 0.5,
                   "glm4_moe": 0.5, "persimmon": 0.5}
# Attention that takes hidden_size // num_attention_heads whatever a head_dim key says (GPTNeoXAttention,
# StableLmAttention, FalconAttention, PersimmonAttention, MllamaTextSelfAttention; Cohere2Config sets it).
DERIVED_HEAD = {"gpt_neox", "stablelm", "falcon", "persimmon", "mllama", "mllama_text_model", "cohere2",
                # InternLM2Attention: self.head_dim = self.hidden_size // self.num_heads.
                "internlm2"}

# GPT-J / CodeGen attribute_map.
ALIASES = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
           "max_position_embeddings": "n_positions"}

# (layer, seq_len) and (layer, position) probes beyond the defaults.
PROBES = {
    "gemma3_1b_it.json": {"layers": [0, 5]},
    "constructed_gemma3_rope_parameters.json": {"layers": [0, 5]},
    "constructed_gemma3_text_config_defaults.json": {"layers": [0, 5]},
    "constructed_gemma4_proportional.json": {"layers": [0, 5]},
    "constructed_dynamic_ntk.json": {"seq_lens": [0, 4096, 4097, 10000]},
    "phi3_mini_128k_instruct.json": {"seq_lens": [0, 4096, 4097, 131072]},
    "constructed_longrope_factor_partial.json": {"seq_lens": [0, 5000]},
    "constructed_phi3_su.json": {"seq_lens": [0, 5000]},
    "constructed_llama4_nope_temperature.json": {"layers": [0, 3], "positions": [0, 8190, 8191, 8192, 100000]},
    "constructed_ministral3_llama4_beta.json": {"positions": [0, 16383, 16384, 50000, 1000000]},
    "constructed_cohere2_sliding_rope.json": {"layers": [0, 3]},
    "constructed_qwen3_next_linear_attention.json": {"layers": [0, 3]},
    "constructed_exaone4_global_nope.json": {"layers": [0, 3]},
    "constructed_gemma3_yarn_full_only.json": {"layers": [0, 5]},
    "constructed_smollm3_no_rope_layers.json": {"layers": [0, 3]},
    "constructed_qwen3_next_defaults.json": {"layers": [0, 2, 3, 7]},
    "constructed_smollm3_interval_default.json": {"layers": [0, 3, 4, 7]},
    "constructed_exaone4_window_defaults.json": {"layers": [0, 3, 4, 7]},
    "constructed_exaone4_no_window.json": {"layers": [0, 3]},
    "constructed_olmo3_yarn_full_only.json": {"layers": [0, 3, 7]},
    "constructed_olmo3_rope_parameters.json": {"layers": [0, 3]},
    "constructed_lfm2_conv_layers.json": {"layers": [0, 2]},
    "constructed_lfm2_full_attn_idxs_defaults.json": {"layers": [0, 2, 5]},
    "constructed_granitemoehybrid_rope.json": {"layers": [0, 3]},
    "constructed_gemma3n_text_config.json": {"layers": [0, 4, 9]},
    "constructed_vaultgemma_defaults.json": {"layers": [0, 1]},
    "constructed_qwen3_5_text_config.json": {"layers": [0, 3]},
    "constructed_afmoe_sliding_rope.json": {"layers": [0, 3]},
    "constructed_exaone_moe_global_nope.json": {"layers": [0, 3]},
    "constructed_mllama_cross_attention.json": {"layers": [0, 3, 8, 9]},
    "constructed_cwm_llama3.json": {"layers": [0, 1]},
    "constructed_mimo_v2_flash.json": {"layers": [0, 1, 5, 47]},
    "constructed_mimo_v2_flash_block_size.json": {"layers": [0, 1, 2, 3]},
    # InternLM2's legacy dynamic NTK stretches its base once the sequence passes max_position_embeddings.
    "constructed_internvl2_internlm2_dynamic.json": {"seq_lens": [0, 32768, 32769, 65536]},
}


class Config:
    """Attribute lookup as the reference's config objects give it."""

    def __init__(self, d, defaults=None):
        self.d = d
        self.defaults = defaults or {}

    def get(self, key, default=None):
        if key in self.d and self.d[key] is not None:
            return self.d[key]
        if key in ALIASES and self.d.get(ALIASES[key]) is not None:
            return self.d[ALIASES[key]]
        return self.defaults.get(key, default)

    def has(self, key):
        return self.get(key) is not None


def text_config(root):
    # text_config (vision-language models), llm_config (InternVL chat),
    # language_config (DeepSeek-VL) hold the language model's config.
    for key in ("text_config", "llm_config", "language_config"):
        if isinstance(root.get(key), dict):
            return root[key]
    return root


# --- the rope types, one function each ------------------------------------

def default_inv_freq(dim, base):
    return [1.0 / base ** (i / dim) for i in range(0, dim, 2)]


def compute_default(dim, base, p, cfg, seq_len):
    return default_inv_freq(dim, base), 1.0


def compute_linear(dim, base, p, cfg, seq_len):
    return [x / p["factor"] for x in default_inv_freq(dim, base)], 1.0


def compute_dynamic(dim, base, p, cfg, seq_len):
    max_pos = cfg.get("max_position_embeddings")
    seq = max_pos if seq_len is None else max(seq_len, max_pos)
    factor = p["factor"]
    base = base * ((factor * seq / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return default_inv_freq(dim, base), 1.0


def get_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def compute_yarn(dim, base, p, cfg, seq_len):
    original = p["original_max_position_embeddings"]
    factor = p["factor"]
    if factor is None:
        factor = cfg.get("max_position_embeddings") / original
    attention = p.get("attention_factor")
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
    if attention is None:
        if mscale and mscale_all_dim:
            attention = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention = get_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    # _compute_yarn_parameters reads config.rope_parameters.get("truncate", True): the outer dict,
    # which holds one dict per layer type when the parameters are per layer type.
    outer = cfg.rope_parameters
    if outer.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    inv = []
    for i in range(dim // 2):
        pos_freq = base ** (2 * i / dim)
        extrapolation = 1.0 / pos_freq
        interpolation = 1.0 / (factor * pos_freq)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        keep = 1 - ramp
        inv.append(interpolation * (1 - keep) + extrapolation * keep)
    return inv, attention


def compute_longrope(dim, base, p, cfg, seq_len):
    original = p["original_max_position_embeddings"]
    factor = p.get("factor")
    if factor is None:
        factor = cfg.get("max_position_embeddings") / original
    attention = p.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = p["long_factor"] if seq_len and seq_len > original else p["short_factor"]
    return [1.0 / (ext[i // 2] * base ** (i / dim)) for i in range(0, dim, 2)], attention


def compute_llama3(dim, base, p, cfg, seq_len):
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    out = []
    for inv in default_inv_freq(dim, base):
        wavelen = 2 * math.pi / inv
        value = inv / factor if wavelen > old / low else inv
        if not wavelen < old / high and not wavelen > old / low:
            smooth = (old / wavelen - low) / (high - low)
            value = (1 - smooth) * value / factor + smooth * value
        out.append(value)
    return out, 1.0


def compute_proportional(head_dim, base, p, cfg, seq_len):
    factor = p.get("factor", 1.0)
    angles = int(p.get("partial_rotary_factor", 1.0) * head_dim // 2)
    rotated = [1.0 / base ** (i / head_dim) for i in range(0, 2 * angles, 2)]
    inv = rotated + [0.0] * (head_dim // 2 - angles)
    return [x / factor for x in inv], 1.0


ROPE_FUNCTIONS = {"default": compute_default, "linear": compute_linear, "dynamic": compute_dynamic,
                  "yarn": compute_yarn, "longrope": compute_longrope, "llama3": compute_llama3,
                  "proportional": compute_proportional}


# --- standardisation: one parameter dict per layer type --------------------

def standardize(cfg, model_type, per_layer_types):
    """{layer_type or None: params} as the reference's standardize_rope_params."""
    rope = cfg.d.get("rope_scaling") or cfg.d.get("rope_parameters") or {}
    rope = json.loads(json.dumps(rope))  # a copy
    theta = cfg.get("rope_theta", cfg.get("rotary_emb_base", DEFAULT_THETA))
    partial = cfg.get("partial_rotary_factor", cfg.get("rotary_pct"))
    if per_layer_types and rope and set(rope) <= set(per_layer_types):
        entries = rope
        top_original = None
    else:
        entries = {None: rope}
        top_original = cfg.get("original_max_position_embeddings")
    for entry in entries.values():
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        if rope_type == "mrope":
            rope_type = "default"
        if rope_type == "su" or (model_type == "phi3" and "rope_type" not in entry and rope_type == "yarn"):
            rope_type = "longrope"
        entry["rope_type"] = rope_type
        entry.setdefault("rope_theta", theta)
        if partial is not None:
            entry["partial_rotary_factor"] = partial
        elif model_type in DEFAULT_PARTIAL:
            # e.g. Qwen3NextConfig.__post_init__: kwargs.setdefault("partial_rotary_factor", 0.25), which the
            # standardisation sets on the parameters as a default (their own value wins).
            entry.setdefault("partial_rotary_factor", DEFAULT_PARTIAL[model_type])
        if rope_type in ("llama3", "yarn", "longrope"):
            if top_original is not None:
                entry["original_max_position_embeddings"] = top_original
            else:
                entry.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    return entries


def describe(name, root):
    cfg_dict = text_config(root)
    model_type = cfg_dict.get("model_type") or root.get("model_type", "")
    config_type = model_type
    if model_type not in ROTATION_OF_FAMILY:
        # A derivative under its own type name: the class architectures names.
        for arch in (cfg_dict.get("architectures") or []) + (root.get("architectures") or []):
            if family_of_architecture(arch):
                model_type = family_of_architecture(arch)
                break
    gemma3 = model_type in ("gemma3", "gemma3_text")
    gemma3n = model_type in ("gemma3n", "gemma3n_text")
    cfg = Config(cfg_dict, GEMMA3_TEXT_DEFAULTS if gemma3 else CLASS_DEFAULTS.get(model_type))
    deepseek = model_type in MLA_FAMILIES
    chatglm = model_type == "chatglm"

    style = pairing_of(model_type)
    if deepseek and model_type not in ALWAYS_INTERLEAVED and not cfg.d.get("rope_interleave", True):
        style = "rotate_half"

    # Head and rotary sizes.
    if deepseek:
        head_dim = cfg.get("qk_rope_head_dim")
        offset = cfg.get("qk_nope_head_dim")
        qk_head_dim = offset + head_dim
    elif chatglm or model_type == "jetmoe":
        # ChatGLM's kv_channels; JetMoeConfig's attribute_map head_dim -> kv_channels.
        head_dim = cfg.get("kv_channels") or cfg.get("hidden_size") // cfg.get("num_attention_heads")
        offset, qk_head_dim = 0, head_dim
    elif model_type in DERIVED_HEAD:
        head_dim = cfg.get("hidden_size") // cfg.get("num_attention_heads")
        offset, qk_head_dim = 0, head_dim
    else:
        head_dim = cfg.get("head_dim") or cfg.get("hidden_size") // cfg.get("num_attention_heads")
        offset, qk_head_dim = 0, head_dim
    num_layers = cfg.get("num_hidden_layers", cfg.get("num_layers"))

    # Layer types.
    layer_types = cfg.get("layer_types")
    if layer_types is None and (gemma3 or model_type == "cohere2"):
        pattern = cfg.get("sliding_window_pattern", 6 if gemma3 else 4)
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    # Exaone4Config: sliding_window is a field defaulting to 4096 (an absent key keeps it), None only when
    # the config says null.
    exaone4_window = model_type in ("exaone4", "exaone_moe") and not ("sliding_window" in cfg.d and cfg.d["sliding_window"] is None)
    if layer_types is None and model_type in ("gemma3n", "gemma3n_text", "olmo3"):
        # Gemma3nTextConfig / Olmo3Config.__post_init__: every 5th / 4th layer is full attention.
        every = 5 if gemma3n else 4
        layer_types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(num_layers)]
    if layer_types is None and model_type == "afmoe":
        every = cfg.get("global_attn_every_n_layers", 4)
        layer_types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(num_layers)]
    if layer_types is None and model_type == "lfm2":
        # Lfm2Config: full_attention at full_attn_idxs (all layers when absent), conv elsewhere.
        idxs = cfg.get("full_attn_idxs")
        layer_types = ["full_attention" if idxs is None or i in idxs else "conv" for i in range(num_layers)]
    if layer_types is None and model_type == "granitemoehybrid":
        layer_types = cfg.get("layers_block_type") or ["mamba"] * num_layers
    if layer_types is None and model_type in ("exaone4", "exaone_moe"):
        # Exaone4Config.__post_init__: a None sliding_window sets sliding_window_pattern to 0; layer_types are
        # "sliding_attention" where (i + 1) % sliding_window_pattern (default 4) is non-zero.
        pattern = cfg.d.get("sliding_window_pattern", 4) if exaone4_window else 0
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if layer_types is None and model_type in QWEN3_NEXT_LAYERS:
        # Qwen3NextConfig.__post_init__: interval = kwargs.pop("full_attention_interval", 4); layer i is
        # "linear_attention" where (i + 1) % interval is non-zero, else "full_attention".
        interval = cfg.get("full_attention_interval", 4)
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)]
    mimo = model_type == "mimo_v2_flash"
    if mimo:
        # MiMoV2DecoderLayer / vLLM's is_compressed_softmax_layer: hybrid_layer_pattern[i] == 1 is a
        # sliding-window layer; MiMoV2FlashConfig builds the pattern from hybrid_block_size when absent.
        pattern = cfg.get("hybrid_layer_pattern") or [0 if (i + 1) % cfg.get("hybrid_block_size") == 0 else 1
                                                      for i in range(num_layers)]
        layer_types = ["sliding_attention" if pattern[i] == 1 else "full_attention" for i in range(num_layers)]
    entries = standardize(cfg, model_type, layer_types)
    local_base = gemma3 or gemma3n or cfg.has("rope_local_base_freq")
    olmo3 = model_type == "olmo3"
    if None not in entries:
        cfg.rope_parameters = entries
    elif olmo3:
        # Olmo3Config.convert_rope_params_to_dict: both layer types start as the default rope; rope_scaling
        # updates full_attention only.
        cfg.rope_parameters = {"full_attention": entries[None],
                               "sliding_attention": {"rope_type": "default",
                                                     "rope_theta": entries[None]["rope_theta"]}}
    elif local_base:
        # Gemma3TextConfig folds rope_local_base_freq into per-layer-type parameters.
        cfg.rope_parameters = {"full_attention": entries[None],
                               "sliding_attention": {"rope_type": "default",
                                                     "rope_theta": cfg.get("rope_local_base_freq")}}
    else:
        cfg.rope_parameters = entries[None]

    def kind(params, layer_type):
        """(rotates, head_dim, rotary_dim, function of seq_len, params)."""
        dim = head_dim
        if model_type in ("gemma4", "gemma4_text") and layer_type == "full_attention":
            dim = cfg.get("global_head_dim") or head_dim
        if mimo and layer_type == "sliding_attention":
            dim = cfg.get("swa_head_dim")  # MiMoV2Attention of a sliding-window layer: swa_head_dim
        rope_type = params["rope_type"]
        base = params["rope_theta"]
        if chatglm:
            base = 10000 * cfg.get("rope_ratio", 1)
        if rope_type == "proportional":
            rotary = dim
        elif chatglm:
            rotary = dim // 2
        elif params.get("partial_rotary_factor") is not None:
            rotary = int(dim * params["partial_rotary_factor"])
        elif cfg.has("rotary_dim"):
            rotary = cfg.get("rotary_dim")
        else:
            rotary = dim
        fn = ROPE_FUNCTIONS[rope_type]
        if rope_type == "proportional":
            return True, dim, rotary, lambda seq_len: fn(dim, base, params, cfg, seq_len), params
        return True, dim, rotary, lambda seq_len: fn(rotary, base, params, cfg, seq_len), params

    def params_of(layer_type):
        if None not in entries:
            return entries[layer_type]
        if (local_base or olmo3) and layer_type == "sliding_attention":
            return cfg.rope_parameters["sliding_attention"]
        if mimo and layer_type == "sliding_attention":
            # vLLM's MiMoV2FlashDecoderLayer: rope_theta=swa_rope_theta for sliding-window layers.
            return dict(entries[None], rope_theta=cfg.get("swa_rope_theta"))
        return entries[None]

    # Which layers apply RoPE, as each family's attention decides.
    flags = None
    if cfg.has("no_rope_layers") or model_type in ("llama4", "llama4_text", "smollm3"):
        # Llama4TextConfig / SmolLM3Config: no_rope_layers[i] == 0 marks a NoPE layer; when None,
        # SmolLM3Config.__post_init__ builds int((i + 1) % no_rope_layer_interval != 0), interval default 4.
        flags = cfg.get("no_rope_layers") or [int((i + 1) % cfg.get("no_rope_layer_interval", 4) != 0)
                                               for i in range(num_layers)]

    def layer_rotates(i):
        t = layer_types[i] if layer_types else None
        if flags is not None and not flags[i]:
            return False
        if model_type in QWEN3_NEXT_LAYERS and t == "linear_attention":
            return False  # Qwen3NextDecoderLayer: linear_attn (gated delta net) gets no position embeddings
        if model_type in ("lfm2", "lfm2_moe"):
            return t == "full_attention"  # Lfm2DecoderLayer: conv layers are short convolutions
        if model_type == "granitemoehybrid":
            # GraniteMoeHybridModel builds a rotary embedding only for position_embedding_type "rope".
            return t in ("attention", "full_attention") and cfg.get("position_embedding_type") == "rope"
        if model_type == "afmoe":
            return t == "sliding_attention"  # AfmoeAttention: rotary only if self.is_local_attention
        if model_type in ("mllama", "mllama_text_model") and i in cfg.get("cross_attention_layers"):
            return False  # MllamaCrossAttentionDecoderLayer: no self-attention, no RoPE
        if model_type == "cohere2":
            return t == "sliding_attention"  # Cohere2Attention: RoPE only where sliding_window is set
        if exaone4_window:
            return t == "sliding_attention"  # Exaone4Attention: sliding_window is None or self.is_sliding
        return True

    def layer_kind(i):
        t = layer_types[i] if layer_types else None
        if not layer_rotates(i):
            dim = head_dim
            if model_type in ("gemma4", "gemma4_text") and t == "full_attention":
                dim = cfg.get("global_head_dim") or head_dim
            return (False, dim, 0, None, None)
        return kind(params_of(t), t)

    def layer_type_of(i):
        return layer_types[i] if layer_types else ""

    if None not in entries:
        main_params = entries["full_attention"] if "full_attention" in entries else entries[layer_types[0]]
    else:
        main_params = entries[None]

    main = kind(main_params, "full_attention")
    main_rotary = main[2]

    # M-RoPE: the (t, h, w) axis of each pair.
    section = main_params.get("mrope_section")
    qwen3_vl = model_type in ("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text")
    qwen3_5 = model_type in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
    if section is None and qwen3_5:
        section = [11, 11, 10]  # Qwen3_5TextConfig's mrope_section
    ernie_vl = model_type in ("ernie4_5_vl_moe", "ernie4_5_vl_moe_text")
    if section is None and qwen3_vl:
        section = [24, 20, 20]
    if section is None and ernie_vl:
        section = [22, 22, 20]
    pair_axes = None
    if section is not None:
        pairs = main_rotary // 2
        if ernie_vl:
            # freq_hw = stack(h, w) of the pre-split even / odd pairs, then t.
            hw = section[0] + section[1]
            pair_axes = [(1 if p % 2 == 0 else 2) if p < hw else 0 for p in range(pairs)]
        elif qwen3_vl or qwen3_5 or main_params.get("mrope_interleaved"):
            pair_axes = [0] * pairs
            for axis, offset_ in ((1, 1), (2, 2)):
                for p in range(offset_, section[axis] * 3, 3):
                    pair_axes[p] = axis
        else:
            pair_axes = [0] * section[0] + [1] * section[1] + [2] * section[2]

    # Attention scores: each layer's attention sets self.scaling from its own q/k head size.
    mscale = None
    if deepseek and (cfg.d.get("rope_scaling") or cfg.d.get("rope_parameters")) and \
            main_params["rope_type"] != "default":
        mscale_all_dim = main_params.get("mscale_all_dim", 0)
        if mscale_all_dim:
            # yarn_get_mscale(rope_parameters["factor"], mscale_all_dim): a null factor fails there.
            mscale = get_mscale(main_params["factor"], mscale_all_dim)

    def softmax_of(layer_head_dim):
        divisor = qk_head_dim if deepseek else layer_head_dim
        if model_type in ("gemma2", "gemma3", "gemma3_text", "vaultgemma") and cfg.has("query_pre_attn_scalar"):
            divisor = cfg.get("query_pre_attn_scalar")
        scale = divisor ** -0.5
        if model_type in ("gemma4", "gemma4_text", "gemma3n", "gemma3n_text"):
            scale = 1.0  # Gemma4TextAttention / Gemma3nTextAttention: scaling = 1.0 (q and k are RMS-normalised)
        if model_type in GRANITE:
            return cfg.get("attention_multiplier", 1.0)  # GraniteAttention: scaling = config.attention_multiplier
        if mscale is not None:
            scale = scale * mscale * mscale  # DeepseekV3Attention: scaling * mscale * mscale
        return scale

    softmax = softmax_of(main[1])

    # What the MLA attention reads from the config beyond its rope: the latent ranks (q_lora_rank None: q is
    # projected directly), the value head size, and for sparse layers the indexer, which scores
    # relu(q.k * index_head_dim ** -0.5) per head with weights times index_n_heads ** -0.5.
    mla = None
    if deepseek:
        mla = {"kv_lora_rank": cfg.d["kv_lora_rank"], "q_lora_rank": cfg.d["q_lora_rank"],
               "qk_nope_head_dim": offset, "qk_rope_head_dim": head_dim, "v_head_dim": cfg.d["v_head_dim"],
               "mscale": 1.0 if mscale is None else mscale, "softmax_scale": softmax, "style": style,
               "indexer": None}
        if model_type in INDEXER_ROTATION:
            index_head_dim, index_heads = cfg.d["index_head_dim"], cfg.d["index_n_heads"]
            mla["indexer"] = {"topk": cfg.d["index_topk"], "head_dim": index_head_dim, "n_heads": index_heads,
                              "style": ROTATION_PAIRING[INDEXER_ROTATION[model_type]],
                              "rotary_offset": 0, "rotary_dim": head_dim,
                              "score_scale": index_head_dim ** -0.5, "weight_scale": index_heads ** -0.5}

    def query_scale(layer, position):
        beta = main_params.get("llama_4_scaling_beta")
        if beta is not None:
            length = main_params["original_max_position_embeddings"]
            return 1 + beta * math.log(1 + math.floor(position / length))
        if model_type in ("llama4", "llama4_text") and cfg.d.get("attn_temperature_tuning", True):
            if layer_kind(layer)[0]:
                return 1.0
            return math.log(math.floor((position + 1.0) / cfg.get("floor_scale", 8192)) + 1.0) * \
                cfg.get("attn_scale", 0.1) + 1.0
        return 1.0

    probes = PROBES.get(name, {})
    out = {
        "file": name,
        "constructed": name.startswith("constructed_"),
        "model_type": config_type,
        "family": model_type,
        "style": style,
        "rotary_offset": offset,
        "num_layers": num_layers or 0,
        "softmax_scale": softmax,
        "pair_axes": pair_axes,
        "mla": mla,
        "probes": [],
        "query_scales": [],
    }
    for layer in probes.get("layers", [0]):
        rotates, dim, rotary, fn, params = layer_kind(layer)
        # The length the frequencies switch at: dynamic NTK stretches the base past
        # max_position_embeddings (_compute_dynamic_ntk_parameters), longrope takes
        # long_factor past original_max_position_embeddings (_compute_longrope_parameters).
        switch = 0
        if rotates and params["rope_type"] == "dynamic":
            switch = cfg.get("max_position_embeddings")
        if rotates and params["rope_type"] == "longrope":
            switch = params["original_max_position_embeddings"]
        for seq_len in probes.get("seq_lens", [0]):
            probe = {"layer": layer, "layer_type": layer_type_of(layer), "seq_len": seq_len, "rotates": rotates,
                     "head_dim": dim, "rotary_dim": rotary, "seq_len_switch": switch, "style": style,
                     "rotary_offset": offset, "softmax_scale": softmax_of(dim)}
            if rotates:
                inv, attention = fn(seq_len)
                probe["inv_freq"] = inv
                probe["attention_factor"] = attention
            out["probes"].append(probe)
    for layer in probes.get("layers", [0]):
        for position in probes.get("positions", [0, 100000]):
            out["query_scales"].append({"layer": layer, "position": position,
                                        "scale": query_scale(layer, position)})
    return out


def main():
    parser = argparse.ArgumentParser(description="Write the expected RoPE of every config in configs/.")
    parser.add_argument("--output", default=os.path.join(HERE, "expected.json"), help="where to write")
    parser.add_argument("--check", action="store_true",
                        help="write to a temporary file and fail unless it equals expected.json")
    args = parser.parse_args()
    results = []
    for name in sorted(os.listdir(CONFIGS)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(CONFIGS, name)) as f:
            root = json.load(f)
        results.append(describe(name, root))
    text = json.dumps({"generator": "tests/data/hf/reference.py", "configs": results}, indent=1) + "\n"
    if args.check:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(text)
        with open(f.name) as got, open(os.path.join(HERE, "expected.json")) as want:
            same = got.read() == want.read()
        os.unlink(f.name)
        if not same:
            print("expected.json is stale: regenerate it with python3 tests/data/hf/reference.py")
            return 1
        print(f"expected.json matches the reference for {len(results)} configs")
        return 0
    with open(args.output, "w") as f:
        f.write(text)
    print(f"wrote expected values for {len(results)} configs to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
