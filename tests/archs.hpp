// The per-architecture loop of rope's tests: every kernel test runs on each
// architecture this build targets and the CPU runs, and names the ones it
// leaves out because they have no batches of the element type (32-bit neon
// has no double), so a skip shows in the test's output.
#pragma once

#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/detail/simd.hpp>

namespace rope_test {

template <class T>
const char* scalar_name() {
  return std::is_same<T, float>::value ? "float" : std::is_same<T, double>::value ? "double" : "?";
}

// Calls f(Arch{}) on every runnable architecture with batches of T; returns
// the names of the architectures it ran, in the order it ran them.
template <class T, class F>
std::vector<std::string> for_each_arch(F&& f) {
  std::vector<std::string> ran;
  rope::detail::for_each_runnable_arch<T>(
      [&](auto arch) {
        ran.emplace_back(decltype(arch)::name());
        f(arch);
      },
      [](auto arch) {
        std::cout << "[ skipped  ] architecture " << decltype(arch)::name() << ": no batches of "
                  << scalar_name<T>() << "\n";
      });
  return ran;
}

}  // namespace rope_test
