// rope/hf/definitions.hpp — the definitions of rope::hf::parse, from_json
// and load, declared in hf_config.hpp: inline there (header-only), or
// compiled once into the library of src/hf_config/reader.cpp when
// ROPE_HF_CONFIG_LIBRARY is defined. Internal to rope::hf: include
// <rope/hf_config.hpp>.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../detail/fail.hpp"
#include "../hf_config.hpp"
#include "model.hpp"
#include "read.hpp"

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

// Inline where hf_config.hpp declared them so (no ROPE_HF_CONFIG_LIBRARY).
ModelRope parse(const std::string& text, const ParseOptions& options) {
  const char* fn = "rope::hf::parse";
  return detail::read(fn, detail::parse_json(fn, "the config text", text), options);
}

ModelRope from_json(const nlohmann::json& config, const ParseOptions& options) {
  return detail::read("rope::hf::from_json", config, options);
}

ModelRope load(const std::string& path, const ParseOptions& options) {
  const char* fn = "rope::hf::load";
  std::ifstream in(path, std::ios::binary);
  if (!in) rope::detail::fail(fn, "path", "a readable file", path);
  std::ostringstream text;
  text << in.rdbuf();
  return detail::read(fn, detail::parse_json(fn, path, text.str()), options);
}

}  // namespace rope::hf
