// rope/hf/mrope.hpp — the M-RoPE axis of each pair from a rope entry's
// mrope_section (Qwen2-VL, Qwen3-VL, GLM-4V, ERNIE-4.5-VL). Internal to rope::hf.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "../pair_axes.hpp"
#include "reader.hpp"
#include "rope_entry.hpp"

namespace rope::hf::detail {

// The axis of each pair from mrope_section.
inline std::optional<PairAxes> pair_axes(const Context& c, const Reader& entry, std::size_t rotary_dim) {
  std::optional<std::vector<std::size_t>> s = entry.count_list("mrope_section");
  if (!s && c.family.qwen3_vl) s = std::vector<std::size_t>{24, 20, 20};
  if (!s && c.family.ernie_vl) s = std::vector<std::size_t>{22, 22, 20};
  if (!s && c.family.qwen3_5) s = std::vector<std::size_t>{11, 11, 10};
  if (!s) return std::nullopt;
  const std::size_t pairs = rotary_dim / 2;
  const Json shown(*s);
  if (s->size() != 3) fail(entry.fn(), entry.path("mrope_section"), "three numbers (t, h, w)", shown.dump());
  const std::size_t sum = (*s)[0] + (*s)[1] + (*s)[2];
  if (sum != pairs) {
    fail(entry.fn(), entry.path("mrope_section"), {"numbers summing to rotary_dim/2 = ", pairs}, shown.dump());
  }
  if (c.family.ernie_vl) {
    // Sections are (h, w, t); h and w alternate over the first h + w pairs.
    if ((*s)[0] != (*s)[1]) fail(entry.fn(), entry.path("mrope_section"), "equal h and w sections", shown.dump());
    return PairAxes::hw_alternating((*s)[0] + (*s)[1], pairs);
  }
  const bool interleaved = c.family.qwen3_vl || c.family.qwen3_5 || entry.flag("mrope_interleaved", false);
  try {
    return PairAxes::sections(
        MropeSections{{(*s)[0], (*s)[1], (*s)[2]}, interleaved ? SectionOrder::interleaved : SectionOrder::chunked},
        pairs);
  } catch (const rope::invalid_argument& err) {
    fail(entry.fn(), entry.path("mrope_section"), std::string("a layout rope can build (") + err.what() + ")",
         shown.dump());
  }
}

}  // namespace rope::hf::detail
