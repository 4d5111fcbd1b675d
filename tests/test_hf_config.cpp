// rope::hf, the checkpoint config reader, against an independent reference:
// tests/data/hf/reference.py computes, from the published formulas of the
// Hugging Face implementation, the pairing, rotary channels, inv_freq,
// attention factor, M-RoPE axes, softmax scale and query scale of every
// config in tests/data/hf/configs (the published configs of
// ../shared/configs, copied unchanged, and constructed ones named
// constructed_*), and writes them to expected.json. The reader must agree
// to 1e-12 relative; its frequencies must drive rope::apply to the rotation
// computed here in long double from the reference's values; and bad configs
// must be refused with an error naming the key and its value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <rope/apply.hpp>
#include <rope/hf_config.hpp>
#include <rope/multi_axis.hpp>
#include <rope/table.hpp>

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kData = ROPE_HF_DATA_DIR;
constexpr double kRelative = 1e-12;

const Json& expected() {
  static const Json j = [] {
    std::ifstream in(kData + "/expected.json");
    return Json::parse(in);
  }();
  return j.at("configs");
}

std::string config_path(const std::string& name) { return kData + "/configs/" + name; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void expect_relative(double got, double want, const std::string& what) {
  if (want == 0.0) {
    EXPECT_EQ(got, 0.0) << what;
  } else {
    EXPECT_LE(std::fabs(got - want), kRelative * std::fabs(want)) << what << ": got " << got << " want " << want;
  }
}

rope::Style style_of(const Json& e) {
  return e.at("style").get<std::string>() == "rotate_half" ? rope::Style::rotate_half : rope::Style::block_diagonal;
}

// The MLA description against the reference's (null for a model without MLA).
void expect_mla(const rope::hf::ModelRope& m, const Json& want) {
  if (want.is_null()) {
    EXPECT_FALSE(m.mla.has_value());
    return;
  }
  ASSERT_TRUE(m.mla.has_value());
  const rope::hf::Mla& mla = *m.mla;
  EXPECT_EQ(mla.kv_lora_rank, want.at("kv_lora_rank").get<std::size_t>());
  EXPECT_EQ(mla.q_lora_rank.has_value(), !want.at("q_lora_rank").is_null());
  if (mla.q_lora_rank && !want.at("q_lora_rank").is_null()) {
    EXPECT_EQ(*mla.q_lora_rank, want.at("q_lora_rank").get<std::size_t>());
  }
  EXPECT_EQ(mla.qk_nope_head_dim, want.at("qk_nope_head_dim").get<std::size_t>());
  EXPECT_EQ(mla.qk_rope_head_dim, want.at("qk_rope_head_dim").get<std::size_t>());
  EXPECT_EQ(mla.v_head_dim, want.at("v_head_dim").get<std::size_t>());
  expect_relative(mla.mscale, want.at("mscale").get<double>(), "mla.mscale");
  expect_relative(mla.softmax_scale, want.at("softmax_scale").get<double>(), "mla.softmax_scale");
  EXPECT_EQ(mla.style, style_of(want));
  const Json& index = want.at("indexer");
  EXPECT_EQ(mla.indexer.has_value(), !index.is_null());
  if (!mla.indexer || index.is_null()) return;
  EXPECT_EQ(mla.indexer->topk, index.at("topk").get<std::size_t>());
  EXPECT_EQ(mla.indexer->head_dim, index.at("head_dim").get<std::size_t>());
  EXPECT_EQ(mla.indexer->n_heads, index.at("n_heads").get<std::size_t>());
  EXPECT_EQ(mla.indexer->style, style_of(index));
  EXPECT_EQ(mla.indexer->rotary_offset, index.at("rotary_offset").get<std::size_t>());
  EXPECT_EQ(mla.indexer->rotary_dim, index.at("rotary_dim").get<std::size_t>());
  expect_relative(mla.indexer->score_scale, index.at("score_scale").get<double>(), "indexer score_scale");
  expect_relative(mla.indexer->weight_scale, index.at("weight_scale").get<double>(), "indexer weight_scale");
}

TEST(HfConfig, EveryConfigMatchesTheReference) {
  ASSERT_FALSE(expected().empty());
  for (const Json& e : expected()) {
    const std::string file = e.at("file");
    SCOPED_TRACE(file);
    const rope::hf::ModelRope m = rope::hf::load(config_path(file));
    EXPECT_EQ(m.model_type, e.at("model_type").get<std::string>());
    EXPECT_EQ(m.family, e.at("family").get<std::string>());
    EXPECT_TRUE(m.guessed.empty());
    EXPECT_EQ(m.style, style_of(e));
    EXPECT_TRUE(m.style_known);
    EXPECT_EQ(m.rotary_offset, e.at("rotary_offset").get<std::size_t>());
    EXPECT_EQ(m.num_layers, e.at("num_layers").get<std::size_t>());
    expect_relative(m.softmax_scale, e.at("softmax_scale").get<double>(), "softmax_scale");
    expect_mla(m, e.at("mla"));
    if (e.at("pair_axes").is_null()) {
      EXPECT_FALSE(m.mrope.has_value());
    } else {
      ASSERT_TRUE(m.mrope.has_value());
      EXPECT_EQ(m.mrope->axes, 3u);
      const auto want = e.at("pair_axes").get<std::vector<int>>();
      ASSERT_EQ(m.mrope->axis.size(), want.size());
      for (std::size_t p = 0; p < want.size(); ++p) EXPECT_EQ(int(m.mrope->axis[p]), want[p]) << "pair " << p;
    }
    for (const Json& probe : e.at("probes")) {
      const std::size_t layer = probe.at("layer");
      const std::size_t seq_len = probe.at("seq_len");
      SCOPED_TRACE("layer " + std::to_string(layer) + " seq_len " + std::to_string(seq_len));
      const auto& kind = m.layer(layer);
      EXPECT_EQ(kind.rotates, probe.at("rotates").get<bool>());
      EXPECT_EQ(kind.head_dim, probe.at("head_dim").get<std::size_t>());
      EXPECT_EQ(kind.layer_type, probe.at("layer_type").get<std::string>());
      EXPECT_EQ(kind.style, style_of(probe));
      EXPECT_EQ(kind.rotary_offset, probe.at("rotary_offset").get<std::size_t>());
      expect_relative(kind.softmax_scale, probe.at("softmax_scale").get<double>(), "kind softmax_scale");
      const std::size_t switch_length = probe.at("seq_len_switch");
      EXPECT_EQ(m.seq_len_dependence(layer).depends, switch_length != 0);
      EXPECT_EQ(m.seq_len_dependence(layer).switch_length, switch_length);
      if (!kind.rotates) {
        EXPECT_THROW(m.frequencies(layer, seq_len), std::invalid_argument);
        continue;
      }
      EXPECT_EQ(kind.rotary_dim, probe.at("rotary_dim").get<std::size_t>());
      const rope::Frequencies f = m.frequencies(layer, seq_len);
      const auto want = probe.at("inv_freq").get<std::vector<double>>();
      ASSERT_EQ(f.inv_freq.size(), want.size());
      for (std::size_t p = 0; p < want.size(); ++p)
        expect_relative(f.inv_freq[p], want[p], "inv_freq[" + std::to_string(p) + "]");
      expect_relative(f.attention_factor, probe.at("attention_factor").get<double>(), "attention_factor");
    }
    for (const Json& q : e.at("query_scales")) {
      const std::size_t layer = q.at("layer");
      const std::int64_t position = q.at("position");
      expect_relative(m.query_scale(layer, position), q.at("scale").get<double>(),
                      "query_scale(" + std::to_string(layer) + ", " + std::to_string(position) + ")");
    }
  }
}

// Every file in configs/ has expected values, every published config of
// ROPE_EXTRA_HF_CONFIGS_DIR is among them unchanged (when one is given), and
// the published ones are not all the reader saw.
TEST(HfConfig, EveryConfigFileIsChecked) {
  std::set<std::string> files, checked;
  for (const auto& entry : fs::directory_iterator(kData + "/configs")) files.insert(entry.path().filename().string());
  std::size_t published = 0;
  for (const Json& e : expected()) {
    checked.insert(e.at("file").get<std::string>());
    const bool constructed = e.at("constructed").get<bool>();
    EXPECT_EQ(constructed, e.at("file").get<std::string>().rfind("constructed_", 0) == 0);
    published += constructed ? 0 : 1;
  }
  EXPECT_EQ(files, checked);
  EXPECT_GE(published, 14u);
  const fs::path shared = ROPE_EXTRA_HF_CONFIGS_DIR;
  if (shared.empty())
    GTEST_SKIP() << "no folder of published configs given (CMake: ROPE_EXTRA_HF_CONFIGS_DIR): copies not compared";
  ASSERT_TRUE(fs::is_directory(shared)) << shared << " (ROPE_EXTRA_HF_CONFIGS_DIR) is not a folder";
  std::size_t compared = 0;
  for (const auto& entry : fs::directory_iterator(shared)) {
    if (entry.path().extension() != ".json") continue;
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    ASSERT_TRUE(checked.count(name)) << "a published config without expected values";
    EXPECT_EQ(read_file(entry.path()), read_file(config_path(name))) << "the copy differs from the published file";
    ++compared;
  }
  EXPECT_EQ(compared, published);
}

// The reader's frequencies drive rope::apply (or apply_mrope with the
// reader's pair axes) on the reader's channels; the result equals the
// rotation computed here in long double from the reference's inv_freq,
// attention factor, pairing and offset.
TEST(HfConfig, FrequenciesDriveApplyToTheReferenceRotation) {
  constexpr std::size_t kTokens = 5, kHeads = 2, kPositions = 64, kSpare = 2;
  std::mt19937 gen(2024);
  std::uniform_real_distribution<double> value(-1.0, 1.0);
  std::uniform_int_distribution<std::int64_t> position(0, kPositions - 1);
  for (const Json& e : expected()) {
    const std::string file = e.at("file");
    const Json* probe = nullptr;
    for (const Json& p : e.at("probes")) {
      if (p.at("rotates").get<bool>() && probe == nullptr) probe = &p;
    }
    ASSERT_NE(probe, nullptr) << file;
    SCOPED_TRACE(file + " layer " + std::to_string(probe->at("layer").get<std::size_t>()));
    const rope::hf::ModelRope m = rope::hf::load(config_path(file));
    const std::size_t layer = probe->at("layer"), seq_len = probe->at("seq_len");
    const std::size_t head_dim = probe->at("head_dim"), rotary_dim = probe->at("rotary_dim");
    const std::size_t offset = e.at("rotary_offset");
    const std::size_t width = offset + head_dim + kSpare;  // unrotated channels on both sides
    const auto inv = probe->at("inv_freq").get<std::vector<double>>();
    const long double attention = probe->at("attention_factor").get<double>();
    const bool multi = !e.at("pair_axes").is_null();
    const std::vector<int> axes = multi ? e.at("pair_axes").get<std::vector<int>>() : std::vector<int>(inv.size(), 0);

    std::vector<double> x(kTokens * kHeads * width);
    for (auto& v : x) v = value(gen);
    std::vector<std::int64_t> positions((multi ? 3 : 1) * kTokens);
    for (auto& p : positions) p = position(gen);

    std::vector<double> y = x;
    const rope::Table<double> table(m.frequencies(layer, seq_len), kPositions);
    const rope::View<double> view(y.data() + offset, kTokens, kHeads, head_dim, kHeads * width, width);
    if (multi) {
      rope::apply_mrope(view, table, m.style, positions.data(), *m.mrope);
    } else {
      rope::apply(view, table, m.style, positions.data());
    }

    const bool half = style_of(e) == rope::Style::rotate_half;
    for (std::size_t t = 0; t < kTokens; ++t) {
      for (std::size_t h = 0; h < kHeads; ++h) {
        const std::size_t row = (t * kHeads + h) * width;
        std::vector<long double> want(x.begin() + static_cast<std::ptrdiff_t>(row),
                                      x.begin() + static_cast<std::ptrdiff_t>(row + width));
        for (std::size_t p = 0; p < rotary_dim / 2; ++p) {
          const std::size_t a = offset + (half ? p : 2 * p), b = offset + (half ? p + rotary_dim / 2 : 2 * p + 1);
          const long double angle =
              static_cast<long double>(positions[static_cast<std::size_t>(axes[p]) * kTokens + t]) * inv[p];
          const long double c = attention * std::cos(angle), s = attention * std::sin(angle);
          want[a] = x[row + a] * c - x[row + b] * s;
          want[b] = x[row + b] * c + x[row + a] * s;
        }
        for (std::size_t ch = 0; ch < width; ++ch) {
          EXPECT_NEAR(y[row + ch], static_cast<double>(want[ch]), kRelative)
              << "token " << t << " head " << h << " channel " << ch;
        }
      }
    }
  }
}

// A config text that must be refused, the key path its error names and the
// value it shows.
struct Bad {
  std::string text, key, value;
};

// Each bad config is refused by rope::hf::parse with std::invalid_argument
// naming the key path and showing its value.
void expect_named_errors(const std::vector<Bad>& cases) {
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.text);
    try {
      (void)rope::hf::parse(b.text);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& err) {
      const std::string msg = err.what();
      EXPECT_EQ(msg.rfind("rope::hf::parse: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(b.key), std::string::npos) << "does not name " << b.key << ": " << msg;
      EXPECT_NE(msg.find(b.value), std::string::npos) << "does not show " << b.value << ": " << msg;
    }
  }
}

// The config of rope::hf::parse: base with extra's keys set (null ones
// too) and the keys of erase removed.
std::string edited(Json base, const Json& extra, const std::vector<std::string>& erase = {}) {
  for (const auto& item : extra.items()) base[item.key()] = item.value();
  for (const auto& key : erase) base.erase(key);
  return base.dump();
}

// Each bad config is refused with std::invalid_argument naming the key path
// and showing its value.
TEST(HfConfig, BadConfigsAreNamedErrors) {
  const Json llama = {{"model_type", "llama"},
                      {"hidden_size", 4096},
                      {"num_attention_heads", 32},
                      {"num_hidden_layers", 2},
                      {"max_position_embeddings", 4096}};
  const auto with = [&](const Json& extra) {
    Json j = llama;
    for (const auto& item : extra.items()) {
      if (item.value().is_null()) {
        j.erase(item.key());
      } else {
        j[item.key()] = item.value();
      }
    }
    return j.dump();
  };
  const std::vector<Bad> cases = {
      {with({{"rope_scaling", {{"rope_type", "fancy"}, {"factor", 2}}}}), "rope_scaling.rope_type", "\"fancy\""},
      {with({{"rope_scaling", {{"type", "weird"}}}}), "rope_scaling.type", "\"weird\""},
      {with({{"rope_scaling", {{"rope_type", 7}}}}), "rope_scaling.rope_type", "7"},
      {with({{"rope_scaling", {{"rope_type", "linear"}, {"factor", "8"}}}}), "rope_scaling.factor", "\"8\""},
      {with({{"rope_scaling", {{"rope_type", "linear"}, {"factor", 0}}}}), "rope_scaling.factor", "got 0"},
      {with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", -4}}}}), "rope_scaling.factor", "-4"},
      {with({{"rope_scaling", {{"rope_type", "linear"}}}}), "rope_scaling.factor", "nothing"},
      {with({{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2}}}, {"max_position_embeddings", nullptr}}),
       "max_position_embeddings", "nothing"},
      {with({{"rope_scaling",
              {{"rope_type", "llama3"},
               {"factor", 8},
               {"high_freq_factor", 4},
               {"original_max_position_embeddings", 8192}}}}),
       "rope_scaling.low_freq_factor", "nothing"},
      {with({{"rope_scaling",
              {{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", -1}, {"high_freq_factor", 4}}}}),
       "rope_scaling.low_freq_factor", "-1"},
      {with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}, {"beta_fast", -32}}}}), "rope_scaling.beta_fast",
       "-32"},
      {with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}, {"attention_factor", 0}}}}),
       "rope_scaling.attention_factor", "got 0"},
      {with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}, {"truncate", "no"}}}}), "rope_scaling.truncate",
       "\"no\""},
      {with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 0}}}}),
       "rope_scaling.original_max_position_embeddings", "got 0"},
      {with({{"rope_scaling", {{"rope_type", "longrope"}, {"short_factor", {1, 1, 1}}, {"long_factor", {1, 1, 1}}}}}),
       "rope_scaling.short_factor", "3 numbers"},
      {with({{"rope_scaling", {{"rope_type", "longrope"}, {"long_factor", {1, 1}}}}}), "rope_scaling.short_factor",
       "nothing"},
      {with({{"rope_scaling", {{"rope_type", "longrope"}, {"short_factor", {1, 1}}, {"long_factor", {1, -1}}}}}),
       "rope_scaling.long_factor[1]", "-1"},
      {with({{"rope_scaling",
              {{"type", "longrope"}, {"short_factor", {1, 1}}, {"long_factor", {1, 1}}, {"short_mscale", 1.25}}}}),
       "rope_scaling.short_mscale", "1.25"},
      {with({{"rope_scaling", {1, 2}}}), "rope_scaling", "[1,2]"},
      {with({{"rope_theta", "1e4"}}), "rope_theta", "\"1e4\""},
      {with({{"rope_theta", -10000}}), "rope_theta", "-10000"},
      {with({{"hidden_size", nullptr}}), "head_dim", "nothing"},
      {with({{"num_attention_heads", 32.5}}), "num_attention_heads", "32.5"},
      {with({{"num_attention_heads", -32}}), "num_attention_heads", "-32"},
      {with({{"head_dim", 0}}), "head_dim", "got 0"},
      {with({{"partial_rotary_factor", 1.5}}), "partial_rotary_factor", "1.5"},
      {with({{"head_dim", 10}, {"partial_rotary_factor", 0.5}}), "partial_rotary_factor", "0.5"},
      {with({{"model_type", "qwen2_vl"}, {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {16, 24, 23}}}}}),
       "rope_scaling.mrope_section", "[16,24,23]"},
      {with({{"model_type", "qwen2_vl"}, {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {32, 32}}}}}),
       "rope_scaling.mrope_section", "[32,32]"},
      {with({{"model_type", "qwen2_vl"}, {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {"a", 32, 32}}}}}),
       "rope_scaling.mrope_section[0]", "\"a\""},
      {with({{"model_type", "qwen3_vl"}, {"rope_theta", 5e6}, {"rope_scaling", {{"mrope_section", {2, 31, 31}}}}}),
       "rope_scaling.mrope_section", "[2,31,31]"},
      {with({{"text_config", "llama"}}), "text_config", "\"llama\""},
      {Json{{"model_type", "llava"},
            {"text_config", Json::parse(with({{"rope_scaling", {{"rope_type", "linear"}, {"factor", -1}}}}))}}
           .dump(),
       "text_config.rope_scaling.factor", "-1"},
      {with({{"layer_types", {"full_attention", "sliding_attention"}},
             {"rope_parameters", {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}}),
       "rope_parameters.sliding_attention", "nothing"},
      {with({{"layer_types", {"full_attention", "full_attention"}},
             {"rope_parameters", {{"full_attention", {{"rope_type", "yarn"}, {"factor", 0}}}}}}),
       "rope_parameters.full_attention.factor", "got 0"},
      {with({{"layer_types", {"full_attention", "full_attention", "full_attention"}},
             {"rope_parameters", {{"full_attention", {{"rope_type", "default"}}}}}}),
       "layer_types", "num_hidden_layers = 2"},
      {with({{"layer_types", {"full_attention", 3}}}), "layer_types[1]", "3"},
      {with({{"model_type", "gemma3_text"}, {"layer_types", {"chunked_attention", "full_attention"}}}),
       "layer_types[0]", "\"chunked_attention\""},
      {with({{"no_rope_layers", {1, 0, 1}}}), "no_rope_layers", "[1,0,1]"},
      {with({{"model_type", "deepseek_v3"}, {"qk_nope_head_dim", 128}}), "qk_rope_head_dim", "nothing"},
      {with({{"model_type", "bloom"}}), "model_type", "\"bloom\""},
      {with({{"model_type", "falcon"}, {"alibi", true}}), "model_type", "\"falcon\""},
      {with({{"rope_parameters", {{"rope_type", "default"}, {"llama_4_scaling_beta", 0.1}}}}),
       "rope_parameters.original_max_position_embeddings", "nothing"},
      // Exaone4Config builds layer_types dividing by a pattern of 0 (null sliding_window) or by a string.
      {R"({"model_type": "exaone4", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 2,
          "sliding_window": null})",
       "layer_types", "nothing"},
      {with({{"model_type", "exaone4"}, {"sliding_window_pattern", "LLLG"}}), "sliding_window_pattern", "\"LLLG\""},
      {with({{"model_type", "qwen3_next"}, {"full_attention_interval", 0}}), "full_attention_interval", "0"},
      // Families whose attention takes no position embedding at all.
      {with({{"model_type", "jamba"}}), "model_type", "\"jamba\""},
      {with({{"model_type", "nemotron_h"}}), "model_type", "\"nemotron_h\""},
      // GraniteMoeHybrid without position_embedding_type "rope": no layer rotates.
      {with({{"model_type", "granitemoehybrid"},
             {"position_embedding_type", "nope"},
             {"layer_types", {"mamba", "attention"}}}),
       "position_embedding_type", "\"nope\""},
      {with({{"model_type", "granitemoehybrid"},
             {"position_embedding_type", "rope"},
             {"layer_types", {"mamba", "ssm"}}}),
       "layer_types[1]", "\"ssm\""},
      // Configurations that complete a config in ways rope does not guess.
      {with({{"model_type", "apertus"}}), "rope_scaling", "nothing"},
      {with({{"model_type", "olmo3"}}), "rope_theta", "nothing"},
      {with({{"model_type", "olmo3"}, {"rope_theta", 10000}}), "rope_theta", "10000"},
      {with({{"model_type", "olmo3"}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}}}),
       "rope_parameters.rope_theta", "1000000"},
      {with({{"model_type", "lfm2"}, {"theta", 500000}, {"rope_theta", 1e6}}), "theta", "500000"},
      // Releases that default rope_theta differently; attention that takes hidden_size / heads.
      {with({{"model_type", "qwen3_vl_text"}}), "rope_theta", "nothing"},
      {with({{"model_type", "persimmon"}}), "rope_theta", "nothing"},
      {with({{"model_type", "gpt_neox"}, {"head_dim", 64}}), "head_dim", "64"},
      {with({{"model_type", "gpt_oss"}}), "rope_scaling", "nothing"},
      // Families whose reference releases disagree are refused as unknown.
      {with({{"model_type", "falcon_h1"}}), "model_type", "\"falcon_h1\""},
      {with({{"model_type", "lfm2_moe"}}), "layer_types", "nothing"},
      {with({{"model_type", "lfm2"}, {"full_attn_idxs", {0, 2}}}), "full_attn_idxs[1]", "2"},
      {with({{"model_type", "lfm2"}, {"layer_types", {"conv", "mamba"}}}), "layer_types[1]", "\"mamba\""},
      {with({{"model_type", "olmo3"}, {"rope_theta", 500000}, {"layer_types", {"full_attention", "chunked"}}}),
       "layer_types[1]", "\"chunked\""},
      {"{\"model_type\": \"llama\", \"hidden_size\": 4096,", "the config text", "byte"},
      {"[1, 2]", "the config", "[1,2]"},
  };
  expect_named_errors(cases);
}

// MLA configs the implementations disagree on, or cannot compute, are
// refused by key: the sizes an MLA layer needs, a sparse layer's q latent,
// the pairing flags of the sparse families, a partial rope part, and YaRN
// factors the softmax scale cannot read.
TEST(HfConfig, MlaRefusalsNameTheKey) {
  const Json glm5 = Json::parse(read_file(config_path("constructed_glm5_glm_moe_dsa.json")));
  const Json v32 = Json::parse(read_file(config_path("constructed_deepseek_v32_exp.json")));
  Json v3 = v32;
  v3["model_type"] = "deepseek_v3";
  for (const char* key : {"index_topk", "index_head_dim", "index_n_heads"}) v3.erase(key);
  const Json yarn = {{"rope_type", "yarn"}, {"factor", 40},          {"original_max_position_embeddings", 4096},
                     {"mscale", 1.0},       {"mscale_all_dim", 1.0}, {"rope_theta", 10000}};
  Json null_factor = yarn;
  null_factor["factor"] = nullptr;
  const std::vector<Bad> cases = {
      {edited(v3, {}, {"kv_lora_rank"}), "kv_lora_rank", "nothing"},
      {edited(v3, {}, {"v_head_dim"}), "v_head_dim", "nothing"},
      {edited(v3, {}, {"q_lora_rank"}), "q_lora_rank", "nothing"},
      {edited(v3, {{"kv_lora_rank", 0}}), "kv_lora_rank", "got 0"},
      {edited(v32, {{"q_lora_rank", nullptr}}), "q_lora_rank", "null"},
      {edited(v32, {{"indexer_rope_interleave", true}}), "indexer_rope_interleave", "true"},
      {edited(v32, {}, {"index_topk"}), "index_topk", "nothing"},
      {edited(v32, {{"index_head_dim", 32}}), "index_head_dim", "32"},
      {edited(glm5, {}, {"indexer_rope_interleave"}), "indexer_rope_interleave", "nothing"},
      {edited(glm5, {{"indexer_rope_interleave", false}}), "indexer_rope_interleave", "false"},
      {edited(glm5, {{"rope_interleave", false}}), "rope_interleave", "false"},
      {edited(glm5, {{"index_n_heads", nullptr}}), "index_n_heads", "nothing"},
      {edited(glm5, {{"rope_parameters", yarn}}), "rope_parameters.mscale_all_dim", "1"},
      {edited(v3, {{"partial_rotary_factor", 0.5}}), "partial_rotary_factor", "rotating 32"},
      {edited(v3, {{"rope_scaling", null_factor}}), "rope_scaling.factor", "null"},
  };
  expect_named_errors(cases);
}

// The families whose modeling code ships with their checkpoints are read as
// that code reads them: what it refuses, or reads otherwise than rope would,
// is refused by key.
TEST(HfConfig, RemoteCodeRefusalsNameTheKey) {
  const Json internlm2 = Json::parse(read_file(config_path("constructed_internlm2_linear.json")));
  const Json mimo = Json::parse(read_file(config_path("constructed_mimo_v2_flash_block_size.json")));
  const std::vector<Bad> cases = {
      {edited(internlm2, {{"rope_scaling", {{"type", "yarn"}, {"factor", 2.0}}}}), "rope_scaling.type", "\"yarn\""},
      {edited(internlm2, {{"rope_scaling", {{"type", "linear"}, {"factor", 2}}}}), "rope_scaling.factor", "got 2"},
      {edited(internlm2, {{"rope_scaling", {{"type", "dynamic"}, {"factor", 0.5}}}}), "rope_scaling.factor", "0.5"},
      {edited(internlm2, {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}), "rope_scaling", "rope_type"},
      {edited(internlm2,
              {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}, {"original_max_position_embeddings", 4}}}}),
       "rope_scaling", "original_max_position_embeddings"},
      {edited(internlm2, {{"rope_scaling", Json::object()}}), "rope_scaling", "{}"},
      {edited(internlm2, {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}}}), "rope_parameters",
       "rope_theta"},
      {edited(internlm2, {{"rope_pos_id_version", "v2pe"}}), "rope_pos_id_version", "\"v2pe\""},
      {edited(internlm2, {{"hidden_size", 4100}}), "hidden_size", "4100"},
      {edited(internlm2, {{"head_dim", 64}}), "head_dim", "64"},
      {edited(mimo, {}, {"swa_rope_theta"}), "swa_rope_theta", "nothing"},
      {edited(mimo, {}, {"swa_head_dim"}), "swa_head_dim", "nothing"},
      {edited(mimo, {}, {"partial_rotary_factor"}), "partial_rotary_factor", "nothing"},
      {edited(mimo, {}, {"rope_theta"}), "rope_theta", "nothing"},
      {edited(mimo, {}, {"head_dim"}), "head_dim", "nothing"},
      {edited(mimo, {}, {"num_hidden_layers"}), "num_hidden_layers", "nothing"},
      {edited(mimo, {}, {"hybrid_block_size"}), "hybrid_layer_pattern", "nothing"},
      {edited(mimo, {{"hybrid_layer_pattern", {0, 1, 0}}}), "hybrid_layer_pattern", "[0,1,0]"},
      {edited(mimo, {{"hybrid_layer_pattern", {0, -1, 0, 1}}}), "hybrid_layer_pattern[1]", "-1"},
      {edited(mimo, {{"layer_types", std::vector<std::string>(4, "full_attention")}}), "layer_types",
       "[\"full_attention\",\"full_attention\""},
      {edited(mimo, {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}), "rope_scaling", "yarn"},
      {edited(mimo, {{"rope_type", "default"}}), "rope_type", "\"default\""},
  };
  expect_named_errors(cases);
}

// InternLM2Config's defaults (hidden_size 4096 over 32 heads, 32 layers,
// 2048 positions) carry its legacy dynamic NTK, whose base past them is the
// closed form base * (f * seq_len / max - (f - 1))^(d / (d - 2)); MiMo-V2-Flash
// reads the first num_hidden_layers entries of a longer hybrid_layer_pattern.
TEST(HfConfig, RemoteCodeDefaultsAndPatterns) {
  const auto internlm2 = rope::hf::parse(R"({"model_type": "internlm2", "rope_theta": 1000000,
      "rope_scaling": {"type": "dynamic", "factor": 2.0}})");
  EXPECT_EQ(internlm2.num_layers, 32u);
  EXPECT_EQ(internlm2.head_dim, 128u);
  EXPECT_EQ(internlm2.seq_len_dependence(0).switch_length, 2048u);
  const double d = 128.0, base = 1e6 * std::pow(2.0 * 4096.0 / 2048.0 - 1.0, d / (d - 2.0));
  const rope::Frequencies f = internlm2.frequencies(0, 4096);
  ASSERT_EQ(f.inv_freq.size(), 64u);
  for (std::size_t p = 0; p < 64; ++p) {
    expect_relative(f.inv_freq[p], std::pow(base, -2.0 * static_cast<double>(p) / d),
                    "inv_freq[" + std::to_string(p) + "]");
  }
  Json mimo = Json::parse(read_file(config_path("constructed_mimo_v2_flash_block_size.json")));
  mimo.erase("hybrid_block_size");
  mimo["hybrid_layer_pattern"] = {1, 0, 0, 1, 1, 1};
  const auto longer = rope::hf::from_json(mimo);
  ASSERT_EQ(longer.num_layers, 4u);
  const std::vector<std::string> want = {"sliding_attention", "full_attention", "full_attention", "sliding_attention"};
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(longer.layer(i).layer_type, want[i]) << "layer " << i;
  EXPECT_EQ(longer.layer(0).head_dim, 64u);
  EXPECT_EQ(longer.layer(1).head_dim, 128u);
}

TEST(HfConfig, LayersPathsAndPairingOverride) {
  const auto llama4 = rope::hf::load(config_path("constructed_llama4_nope_temperature.json"));
  // Layer 3 has no RoPE; layer 8 does not exist.
  try {
    (void)llama4.frequencies(3);
    ADD_FAILURE() << "a NoPE layer gave frequencies";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("NoPE"), std::string::npos) << err.what();
  }
  try {
    (void)llama4.layer(8);
    ADD_FAILURE() << "layer 8 of 8 accepted";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("num_layers = 8, got 8"), std::string::npos) << err.what();
  }
  // load() names the missing file; parse() and load() read alike.
  try {
    (void)rope::hf::load(kData + "/no_such_config.json");
    ADD_FAILURE() << "a missing file loaded";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("no_such_config.json"), std::string::npos) << err.what();
  }
  const std::string path = config_path("llama3_1_8b.json");
  EXPECT_EQ(rope::hf::parse(read_file(path)).frequencies(0).inv_freq, rope::hf::load(path).frequencies(0).inv_freq);
  // A model type rope does not know is refused by name, saying how to
  // proceed; ParseOptions::generic reads it as a plain decoder and says what
  // was guessed; ParseOptions::style asserts its pairing; ParseOptions::family
  // reads it as a known family.
  const std::string unknown = R"({"model_type": "my_model", "hidden_size": 512, "num_attention_heads": 8})";
  try {
    (void)rope::hf::parse(unknown);
    ADD_FAILURE() << "an unknown model_type was read";
  } catch (const rope::invalid_argument& err) {
    const std::string msg = err.what();
    EXPECT_EQ(err.argument(), "model_type") << msg;
    EXPECT_NE(msg.find("\"my_model\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("ParseOptions::family"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ParseOptions::generic"), std::string::npos) << msg;
  }
  rope::hf::ParseOptions generic;
  generic.generic = true;
  const auto guessed = rope::hf::parse(unknown, generic);
  EXPECT_FALSE(guessed.style_known);
  EXPECT_EQ(guessed.style, rope::Style::rotate_half);
  EXPECT_EQ(guessed.rotary_dim, 64u);
  EXPECT_EQ(guessed.family, "");
  EXPECT_EQ(guessed.guessed,
            (std::vector<std::string>{"style", "head_dim", "layers", "rotary_offset", "softmax_scale"}));
  rope::hf::ParseOptions asserted = generic;
  asserted.style = rope::Style::block_diagonal;
  const auto paired = rope::hf::parse(unknown, asserted);
  EXPECT_EQ(paired.style, rope::Style::block_diagonal);
  EXPECT_EQ(paired.kinds[0].style, rope::Style::block_diagonal);
  EXPECT_EQ(std::count(paired.guessed.begin(), paired.guessed.end(), "style"), 0);
  rope::hf::ParseOptions mapped;
  mapped.family = "cohere";
  const auto as_cohere = rope::hf::parse(unknown, mapped);
  EXPECT_TRUE(as_cohere.style_known);
  EXPECT_EQ(as_cohere.family, "cohere");
  EXPECT_EQ(as_cohere.model_type, "my_model");
  EXPECT_EQ(as_cohere.style, rope::Style::block_diagonal);
  EXPECT_TRUE(as_cohere.guessed.empty());
  mapped.family = "my_family";
  EXPECT_THROW((void)rope::hf::parse(unknown, mapped), std::invalid_argument);
  // A generic read refuses layouts only a family defines.
  const std::string mla =
      R"({"model_type": "my_mla", "hidden_size": 512, "num_attention_heads": 8, "qk_rope_head_dim": 64})";
  try {
    (void)rope::hf::parse(mla, generic);
    ADD_FAILURE() << "a generic read accepted qk_rope_head_dim";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("qk_rope_head_dim"), std::string::npos) << err.what();
  }
  // A known family under a new type name, named by architectures, is read as
  // that family.
  const std::string derived = R"({"model_type": "my_qwen", "architectures": ["Qwen3NextForCausalLM"],
      "hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 2,
      "layer_types": ["linear_attention", "full_attention"]})";
  const auto next = rope::hf::parse(derived);
  EXPECT_EQ(next.family, "qwen3_next");
  EXPECT_FALSE(next.rotates(0));
  EXPECT_TRUE(next.rotates(1));
  EXPECT_EQ(next.layer(0).layer_type, "linear_attention");
  // Without layer_types, Qwen3NextConfig makes every full_attention_interval-th
  // layer full attention, rotating a quarter of the head by default (its
  // head_dim defaults to 256, not hidden_size / num_attention_heads).
  const auto interval = rope::hf::parse(R"({"model_type": "qwen3_next", "hidden_size": 512,
      "num_attention_heads": 8, "num_hidden_layers": 4, "full_attention_interval": 2})");
  EXPECT_FALSE(interval.rotates(0));
  EXPECT_TRUE(interval.rotates(1));
  EXPECT_FALSE(interval.rotates(2));
  EXPECT_TRUE(interval.rotates(3));
  EXPECT_EQ(interval.layer(3).layer_type, "full_attention");
  EXPECT_EQ(interval.layer(3).head_dim, 256u);
  EXPECT_EQ(interval.layer(3).rotary_dim, 64u);
  // A nested language model under a key rope does not read is named.
  const std::string nested = R"({"model_type": "my_vlm", "vision_tower": {"model_type": "siglip"},
      "decoder": {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8}})";
  try {
    (void)rope::hf::parse(nested);
    ADD_FAILURE() << "an unknown nesting was read";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("nested under decoder vision_tower"), std::string::npos) << err.what();
  }
}

// Which layers' frequencies depend on the sequence length, and where they
// switch.
TEST(HfConfig, SequenceLengthDependence) {
  const auto dynamic = rope::hf::load(config_path("constructed_dynamic_ntk.json"));
  EXPECT_TRUE(dynamic.seq_len_dependence(0).depends);
  EXPECT_EQ(dynamic.seq_len_dependence(0).switch_length, dynamic.max_position_embeddings);
  const auto phi3 = rope::hf::load(config_path("phi3_mini_128k_instruct.json"));
  EXPECT_TRUE(phi3.seq_len_dependence(0).depends);
  EXPECT_EQ(phi3.seq_len_dependence(0).switch_length, 4096u);
  const auto llama = rope::hf::load(config_path("llama3_1_8b.json"));
  EXPECT_FALSE(llama.seq_len_dependence(0).depends);
  EXPECT_EQ(llama.seq_len_dependence(0).switch_length, 0u);
  const auto llama4 = rope::hf::load(config_path("constructed_llama4_nope_temperature.json"));
  EXPECT_FALSE(llama4.seq_len_dependence(3).depends);
}

// The errors carry the public function called and the key path as
// rope::invalid_argument's function() and argument().
TEST(HfConfig, ErrorsNameTheFunctionAndTheKey) {
  struct Case {
    std::function<void()> call;
    std::string function, argument;
  };
  const Json llama = {{"model_type", "llama"}, {"hidden_size", 4096}, {"num_attention_heads", 32}};
  Json fancy = llama;
  fancy["rope_scaling"] = {{"rope_type", "fancy"}, {"factor", 2}};
  const Json nested = {{"model_type", "llava"},
                       {"text_config",
                        {{"model_type", "llama"},
                         {"hidden_size", 4096},
                         {"num_attention_heads", 32},
                         {"rope_scaling", {{"rope_type", "linear"}, {"factor", -1}}}}}};
  Json sections = llama;
  sections["model_type"] = "qwen3_vl";
  sections["rope_theta"] = 5e6;
  sections["rope_scaling"] = {{"mrope_section", {2, 31, 31}}};
  const auto llama4 = rope::hf::load(config_path("constructed_llama4_nope_temperature.json"));
  const std::vector<Case> cases = {
      {[&] { (void)rope::hf::parse(nested.dump()); }, "rope::hf::parse", "text_config.rope_scaling.factor"},
      {[&] { (void)rope::hf::from_json(fancy); }, "rope::hf::from_json", "rope_scaling.rope_type"},
      {[&] { (void)rope::hf::from_json(sections); }, "rope::hf::from_json", "rope_scaling.mrope_section"},
      {[&] { (void)rope::hf::parse("{\"model_type\": "); }, "rope::hf::parse", "the config text"},
      {[&] { (void)rope::hf::load(kData + "/no_such_config.json"); }, "rope::hf::load", "path"},
      {[&] { (void)llama4.frequencies(3); }, "rope::hf::ModelRope::frequencies", "layer"},
      {[&] { (void)llama4.layer(8); }, "rope::hf::ModelRope", "layer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.function + " " + c.argument);
    try {
      c.call();
      ADD_FAILURE() << "accepted";
    } catch (const rope::invalid_argument& err) {
      EXPECT_EQ(err.function(), c.function) << err.what();
      EXPECT_EQ(err.argument(), c.argument) << err.what();
    }
  }
}

}  // namespace
