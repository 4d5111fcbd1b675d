// rope/error.hpp — the exceptions rope throws for bad input.
//
//   rope::invalid_argument : std::invalid_argument   shapes, strides, options, fields
//   rope::out_of_range     : std::out_of_range       positions outside a table or cache
//
// Each carries the public function the caller called (function()) and the
// argument as the caller spelled it (argument(): "q.head_stride",
// "options.k_offset", "positions[3]"); what() is the whole message,
//   "<function>: <argument> must be <requirement>, got <value>".
// Both derive from the standard exceptions, so a catch of std::exception,
// std::invalid_argument or std::out_of_range still catches them. A call that
// throws one has written nothing. docs/errors.md lists every error.
#pragma once

#include <stdexcept>
#include <string>

namespace rope {

namespace detail {
// The names an error of rope carries besides its message.
class ErrorSource {
 public:
  ErrorSource(std::string function, std::string argument)
      : function_(std::move(function)), argument_(std::move(argument)) {}
  const std::string& function() const noexcept { return function_; }
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string function_;
  std::string argument_;
};
}  // namespace detail

class invalid_argument : public std::invalid_argument, public detail::ErrorSource {
 public:
  invalid_argument(std::string function, std::string argument, const std::string& message)
      : std::invalid_argument(message), detail::ErrorSource(std::move(function), std::move(argument)) {}
};

class out_of_range : public std::out_of_range, public detail::ErrorSource {
 public:
  out_of_range(std::string function, std::string argument, const std::string& message)
      : std::out_of_range(message), detail::ErrorSource(std::move(function), std::move(argument)) {}
};

}  // namespace rope
