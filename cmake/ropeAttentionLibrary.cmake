# The serving path compiled once (ROPE_ATTENTION_LIBRARY, OFF by default):
# append and attend for every cache and row type built into a library,
# rope_attention_library (exported as rope::attention_library), that
# rope::attention links; its users get ROPE_ATTENTION_LIBRARY defined, so
# <rope/attention.hpp> forwards append and attend to that library instead
# of compiling them into each of their translation units (docs/attention.md,
# "Compile cost").
#
#   ROPE_ATTENTION_LIBRARY=OFF  header-only (the default): `cmake --install`
#                               needs no build
#   ROPE_ATTENTION_LIBRARY=ON   the library, where rope::attention is built;
#                               installed by `cmake --install` after
#                               `cmake --build`
# The library is compiled with the build's flags (CMAKE_CXX_FLAGS): a
# distribution build gets the baseline instruction set, and its attend runs
# rope::dispatch's decode loop where the program installs it. STATIC unless
# BUILD_SHARED_LIBS; position-independent either way.
option(ROPE_ATTENTION_LIBRARY "Compile rope::attention's serving path once into a library instead of every user's translation unit" OFF)
# ROPE_ATTENTION_LIBRARY_NATIVE=ON compiles the library with rope::native's
# flags instead (-march=native), for a build whose users are compiled for
# this machine too: rope's own tests hold the library's append and attend to
# the bytes of the header-only calls on the same instruction set, which a
# baseline library does not give (no fused multiply-adds).
option(ROPE_ATTENTION_LIBRARY_NATIVE "Compile rope's attention library with rope::native's flags (for a build of this machine, e.g. rope's tests)" OFF)

if(NOT ROPE_ATTENTION_LIBRARY)
  return()
endif()
if(NOT TARGET rope_attention)
  message(FATAL_ERROR "ROPE_ATTENTION_LIBRARY=ON, but rope::attention is not built (ROPE_ATTENTION=${ROPE_ATTENTION}; it needs Eigen 3.4)")
endif()

add_library(rope_attention_library "${CMAKE_CURRENT_LIST_DIR}/../src/attention/serving.cpp")
add_library(rope::attention_library ALIAS rope_attention_library)
set_target_properties(rope_attention_library PROPERTIES EXPORT_NAME attention_library POSITION_INDEPENDENT_CODE ON)
target_link_libraries(rope_attention_library PUBLIC rope)
target_compile_definitions(rope_attention_library PUBLIC ROPE_ATTENTION_LIBRARY=1)
target_link_libraries(rope_attention INTERFACE rope_attention_library)
if(ROPE_ATTENTION_LIBRARY_NATIVE)
  target_link_libraries(rope_attention_library PRIVATE $<BUILD_INTERFACE:rope_native>)
endif()
foreach(_internal rope_warnings rope_sanitizers)
  if(TARGET ${_internal})
    target_link_libraries(rope_attention_library PRIVATE $<BUILD_INTERFACE:${_internal}>)
  endif()
endforeach()
