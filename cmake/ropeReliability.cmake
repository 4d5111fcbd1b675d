# Sanitizer builds and the fuzz target of rope's own tests (the asan, clang,
# tsan and fuzz presets). Nothing here reaches an installed rope: the flags
# apply only to the targets of this build tree.
#
#   ROPE_SANITIZE=address,undefined   every test, bench and example compiled
#                                     and linked with -fsanitize=<list>, no
#                                     recovery (the first report fails the run)
#   ROPE_SANITIZE=thread              ThreadSanitizer, same scope
#   ROPE_BUILD_FUZZ=ON                tests/fuzz/rope_fuzz, a libFuzzer target
#                                     (clang only)
# With ROPE_BUILD_TESTS the fuzz target's decoder is also built without
# libFuzzer, as a test that replays tests/fuzz/corpus.

set(ROPE_SANITIZE "" CACHE STRING "Sanitizers for rope's tests, bench and examples (-fsanitize= list)")
option(ROPE_BUILD_FUZZ "Build the libFuzzer target tests/fuzz/rope_fuzz (clang)" OFF)

if(ROPE_SANITIZE)
  add_compile_options(-fsanitize=${ROPE_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${ROPE_SANITIZE} -fno-sanitize-recover=all)
endif()

if(ROPE_BUILD_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "ROPE_BUILD_FUZZ needs clang (libFuzzer); the compiler is ${CMAKE_CXX_COMPILER_ID}")
endif()

if(ROPE_BUILD_FUZZ OR ROPE_BUILD_TESTS)
  if(ROPE_BUILD_TESTS)
    enable_testing()
  endif()
  add_subdirectory(tests/fuzz)
endif()
