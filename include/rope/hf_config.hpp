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

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "detail/error.hpp"
#include "hf/model.hpp"
#include "hf/read.hpp"

namespace rope::hf {

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
