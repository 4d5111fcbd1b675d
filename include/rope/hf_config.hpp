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
// pairing of each model family, DeepSeek's softmax scale, Llama 4 style
// query temperatures) and every key it reads are listed in docs/hf_config.md.
//
// The reader lives in rope/hf/: model.hpp (the types returned), reader.hpp
// (checked keys with paths), families.hpp (the table of model families),
// rope_entry.hpp (one reader per rope type), layers.hpp (kinds of layer),
// mrope.hpp (M-RoPE axes) and read.hpp (the phases of a read). It includes
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
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "detail/error.hpp"
#include "hf/model.hpp"
#include "hf/read.hpp"

namespace rope::hf {

namespace detail {

// The JSON of a config's text; `source` names it in the error.
inline Json parse_json(const char* fn, const std::string& source, const std::string& text) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& err) {
    fail(fn, source, std::string("valid JSON (") + err.what() + ")", "byte " + to_text(err.byte));
  }
}

}  // namespace detail

// The model's RoPE from a config.json's text.
inline ModelRope parse(const std::string& text, const ParseOptions& options = {}) {
  const char* fn = "rope::hf::parse";
  return detail::read(fn, detail::parse_json(fn, "the config text", text), options);
}

// The model's RoPE from an already parsed config.
inline ModelRope from_json(const nlohmann::json& config, const ParseOptions& options = {}) {
  return detail::read("rope::hf::from_json", config, options);
}

// The model's RoPE from a config.json file.
inline ModelRope load(const std::string& path, const ParseOptions& options = {}) {
  const char* fn = "rope::hf::load";
  std::ifstream in(path, std::ios::binary);
  if (!in) rope::detail::fail(fn, "path", "a readable file", path);
  std::ostringstream text;
  text << in.rdbuf();
  return detail::read(fn, detail::parse_json(fn, path, text.str()), options);
}

}  // namespace rope::hf
