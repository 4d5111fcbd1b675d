// rope/hf_config.hpp — a Hugging Face checkpoint's config.json read into the
// rotation its reference implementation applies: rope::hf::load, parse and
// from_json, giving a rope::hf::ModelRope.
//
//   const rope::hf::ModelRope model = rope::hf::load("config.json");
//   rope::Table<float> table(model.frequencies(layer, seq_len), positions);
//   rope::apply(q_view, table, model.style, positions_ids);   // channels model.rotary_offset ..
//
// Pair p of the rotary part of a q/k head (channels rotary_offset ..
// rotary_offset + rotary_dim - 1, paired as model.style says) is rotated by
// m * theta_p at position m, theta_p = frequencies(layer, seq_len).inv_freq[p],
// and every cos/sin is multiplied by its attention_factor. What the reader
// understands (both rope_scaling and rope_parameters spellings, text_config /
// llm_config / language_config nesting, per-layer-type parameters, NoPE and
// linear-attention layers, partial rotary, M-RoPE layouts, the
// pairing of each model family, the MLA description and softmax scale,
// Llama 4 style query temperatures) and every key it reads are listed in docs/hf_config.md.
//
// The reader lives in rope/hf/: model.hpp (the types returned), reader.hpp
// (checked keys with paths), families.hpp (the table of model families),
// rope_entry.hpp (one reader per rope type), layers.hpp (kinds of layer),
// mrope.hpp (M-RoPE axes), mla.hpp (what an MLA layer needs) and read.hpp
// (the phases of a read). It includes
// no kernels: frequencies.hpp, pair_axes.hpp, style.hpp and nlohmann_json.
//
// Errors: rope::invalid_argument through rope::detail::fail, naming the key
// path as written in the file (text_config.rope_scaling.factor) and its
// value as JSON text. The reader is never stricter than the reference on a
// config it can compute: keys it does not use are ignored, as there. A
// model_type without a family is refused unless ParseOptions says how to
// read it (docs/hf_config.md, "Refused").
//
// Needs nlohmann_json 3 (CMake target rope::hf_config); the core of rope does
// not include this header.
//
// Header-only by default: the reader is compiled in every translation unit
// that includes this header. With ROPE_HF_CONFIG_LIBRARY defined (CMake:
// -DROPE_HF_CONFIG_LIBRARY=ON, which sets it for every user of
// rope::hf_config, and builds and links the library that holds the reader,
// src/hf_config/reader.cpp), this header declares load, parse and from_json
// only, and a user's translation unit costs about what nlohmann/json.hpp's
// declarations cost. Define it for a whole program or not at all.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "hf/model.hpp"

#if defined(ROPE_HF_CONFIG_LIBRARY)
#define ROPE_HF_ENTRY_POINT
#else
#define ROPE_HF_ENTRY_POINT inline
#endif

namespace rope::hf {

// The model's RoPE from a config.json's text.
ROPE_HF_ENTRY_POINT ModelRope parse(const std::string& text, const ParseOptions& options = {});

// The model's RoPE from an already parsed config.
ROPE_HF_ENTRY_POINT ModelRope from_json(const nlohmann::json& config, const ParseOptions& options = {});

// The model's RoPE from a config.json file.
ROPE_HF_ENTRY_POINT ModelRope load(const std::string& path, const ParseOptions& options = {});

}  // namespace rope::hf

#undef ROPE_HF_ENTRY_POINT

#if !defined(ROPE_HF_CONFIG_LIBRARY)
#include "hf/definitions.hpp"
#endif
