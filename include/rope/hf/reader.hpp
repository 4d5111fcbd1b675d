// rope/hf/reader.hpp — typed, checked access to the keys of one JSON object
// of a config, naming each key by its path (text_config.rope_scaling.factor)
// in errors. Internal to rope::hf.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../detail/fail.hpp"

namespace rope::hf::detail {

using Json = nlohmann::json;
using rope::detail::fail;
using rope::detail::to_text;

// Typed access to one JSON object, with key paths for messages. A key
// holding null reads as absent, as Python's dict.get() makes it.
class Reader {
 public:
  Reader(const char* fn, const Json* object, std::string prefix, const Json* defaults = nullptr)
      : fn_(fn), object_(object), prefix_(std::move(prefix)), defaults_(defaults) {}

  const char* fn() const { return fn_; }
  std::string path(const std::string& key) const { return prefix_ + key; }
  const Json* object() const { return object_; }

  // The value, or the family default, or null when neither exists.
  const Json* find(const std::string& key) const {
    if (object_ != nullptr) {
      const auto it = object_->find(key);
      if (it != object_->end() && !it->is_null()) return &*it;
    }
    if (defaults_ != nullptr) {
      const auto it = defaults_->find(key);
      if (it != defaults_->end()) return &*it;
    }
    return nullptr;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // The key is in the object, even as null.
  bool present(const std::string& key) const { return object_ != nullptr && object_->contains(key); }

  [[noreturn]] void bad(const std::string& key, const std::string& requirement, const Json& value) const {
    fail(fn_, path(key), requirement, value.dump());
  }
  [[noreturn]] void missing(const std::string& key, const std::string& why) const {
    fail(fn_, path(key), "present (" + why + ")", "nothing");
  }

  std::optional<double> number(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) bad(key, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d)) bad(key, "finite", *v);
    return d;
  }
  std::optional<double> positive(const std::string& key) const {
    const auto d = number(key);
    if (d && !(*d > 0.0)) bad(key, "> 0", *find(key));
    return d;
  }
  double required_positive(const std::string& key, const std::string& why) const {
    const auto d = positive(key);
    if (!d) missing(key, why);
    return *d;
  }
  std::optional<std::size_t> count(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<std::size_t>();
    if (v->is_number_integer() && v->get<std::int64_t>() >= 0) return static_cast<std::size_t>(v->get<std::int64_t>());
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (d >= 0.0 && d == std::floor(d) && d < 9.0e15) return static_cast<std::size_t>(d);
    }
    bad(key, "a whole number >= 0", *v);
  }
  std::optional<std::size_t> positive_count(const std::string& key) const {
    const auto n = count(key);
    if (n && *n == 0) bad(key, "> 0", *find(key));
    return n;
  }
  std::optional<std::string> string(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) bad(key, "a string", *v);
    return v->get<std::string>();
  }
  // Python truthiness of a flag the reference tests with `if x:`; absent
  // keys take `absent`, null is false.
  bool flag(const std::string& key, bool absent) const {
    if (!present(key) && !(defaults_ != nullptr && defaults_->contains(key))) return absent;
    const Json* v = find(key);
    if (v == nullptr) return false;
    if (v->is_boolean()) return v->get<bool>();
    if (v->is_number()) return v->get<double>() != 0.0;
    bad(key, "true, false or a number", *v);
  }
  std::vector<double> positive_list(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) missing(key, "longrope needs it");
    if (!v->is_array()) bad(key, "a list of numbers", *v);
    std::vector<double> out;
    for (std::size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      if (!e.is_number() || !(e.get<double>() > 0.0) || !std::isfinite(e.get<double>())) {
        fail(fn_, {path(key), "[", i, "]"}, "a finite number > 0", e.dump());
      }
      out.push_back(e.get<double>());
    }
    return out;
  }
  std::optional<std::vector<std::size_t>> count_list(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array()) bad(key, "a list of whole numbers", *v);
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      if (e.is_boolean()) {
        out.push_back(e.get<bool>() ? 1 : 0);
      } else if (e.is_number_integer() && e.get<std::int64_t>() >= 0) {
        out.push_back(static_cast<std::size_t>(e.get<std::int64_t>()));
      } else {
        fail(fn_, {path(key), "[", i, "]"}, "a whole number >= 0", e.dump());
      }
    }
    return out;
  }

 private:
  const char* fn_;
  const Json* object_;
  std::string prefix_;
  const Json* defaults_;
};

}  // namespace rope::hf::detail
