# Build settings of rope's own tests, bench, examples and fuzz target. None of
# it reaches a user of rope: nothing here is installed or exported, and
# everything hangs off INTERFACE targets that only rope's own targets link.
#
#   rope_warnings     -Wall -Wextra -Wpedantic (ROPE_WERROR: as errors)
#   rope_sanitizers   ROPE_SANITIZE=address,undefined or thread: compiled and
#                     linked with -fsanitize=<list>, no recovery (the first
#                     report fails the run); the asan, clang and tsan presets
#
# rope_internal(<target>) links both; every test, bench and example target
# calls it.

option(ROPE_WERROR "Treat warnings in rope's tests, bench and examples as errors" OFF)
set(ROPE_SANITIZE "" CACHE STRING "Sanitizers for rope's tests, bench and examples (-fsanitize= list)")

add_library(rope_warnings INTERFACE)
target_compile_options(rope_warnings INTERFACE -Wall -Wextra -Wpedantic $<$<BOOL:${ROPE_WERROR}>:-Werror>)
# GCC 12's own AVX-512 permute intrinsics initialise their pass-through
# operand with itself (_mm512_undefined_ps) and then warn about it wherever
# they are inlined; the operand is masked off. GCC 13 no longer warns, and
# the clang build keeps both warnings on for rope's code.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(rope_warnings INTERFACE -Wno-uninitialized -Wno-maybe-uninitialized)
endif()

add_library(rope_sanitizers INTERFACE)
if(ROPE_SANITIZE)
  target_compile_options(rope_sanitizers INTERFACE
    -fsanitize=${ROPE_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(rope_sanitizers INTERFACE -fsanitize=${ROPE_SANITIZE} -fno-sanitize-recover=all)
endif()

function(rope_internal target)
  target_link_libraries(${target} PRIVATE rope_warnings rope_sanitizers)
endfunction()
