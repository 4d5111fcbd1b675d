# rope::dispatch: the tensor API's token loop compiled once per instruction
# set into a small library, the best one chosen at run time
# (include/rope/dispatch.hpp, docs/dispatch.md).
#
#   ROPE_DISPATCH=OFF   not built: rope is headers alone, and
#                       `cmake --install` needs no build (the default)
#   ROPE_DISPATCH=AUTO  built where rope knows the instruction sets (x86-64,
#                       aarch64) and the compiler takes their flags (GCC,
#                       Clang); skipped elsewhere, with a message
#   ROPE_DISPATCH=ON    the same, but a configure error where it cannot be built
# Built (AUTO or ON), it is installed by `cmake --install` after
# `cmake --build`; an install before the build stops saying so.
#
# One translation unit per instruction set, each with that set's flags on
# the source file alone (src/dispatch/isa.hpp says how they are kept apart
# at link time):
#   x86-64   loops_sse2.cpp (no flags), loops_avx2.cpp (-mavx2 -mfma),
#            loops_avx512.cpp (-mavx512f -mavx512cd -mavx512dq -mavx512bw -mavx2 -mfma)
#   aarch64  loops_neon.cpp (no flags)
# STATIC unless BUILD_SHARED_LIBS; position-independent either way, so that
# it can be linked into a user's shared library.
#
# rope_dispatch_flags(<isa> <variable>) gives an instruction set's flags, for
# rope's tests that compile reference code per instruction set.

set(ROPE_DISPATCH OFF CACHE STRING "Build rope::dispatch, runtime dispatch over instruction sets: ON, OFF or AUTO")
set_property(CACHE ROPE_DISPATCH PROPERTY STRINGS ON OFF AUTO)

set(ROPE_DISPATCH_FLAGS_sse2 "")
set(ROPE_DISPATCH_FLAGS_avx2 -mavx2 -mfma)
set(ROPE_DISPATCH_FLAGS_avx512 -mavx512f -mavx512cd -mavx512dq -mavx512bw -mavx2 -mfma)
set(ROPE_DISPATCH_FLAGS_neon "")

function(rope_dispatch_flags isa variable)
  set(${variable} "${ROPE_DISPATCH_FLAGS_${isa}}" PARENT_SCOPE)
endfunction()

set(_rope_dispatch_why "")
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang|AppleClang)$")
  set(_rope_dispatch_why "its instruction-set flags are written for GCC and Clang, not ${CMAKE_CXX_COMPILER_ID}")
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_SIZEOF_VOID_P EQUAL 8)
  set(ROPE_DISPATCH_ISAS sse2 avx2 avx512)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  set(ROPE_DISPATCH_ISAS neon)
else()
  set(_rope_dispatch_why "rope knows no instruction sets to dispatch between on ${CMAKE_SYSTEM_PROCESSOR}")
endif()

if(NOT _rope_dispatch_why)
  include(CheckCXXCompilerFlag)
  foreach(_isa IN LISTS ROPE_DISPATCH_ISAS)
    if(ROPE_DISPATCH_FLAGS_${_isa})
      string(REPLACE ";" " " _flags "${ROPE_DISPATCH_FLAGS_${_isa}}")
      check_cxx_compiler_flag("${_flags}" ROPE_DISPATCH_COMPILER_TAKES_${_isa})
      if(NOT ROPE_DISPATCH_COMPILER_TAKES_${_isa})
        set(_rope_dispatch_why "the compiler refuses the ${_isa} flags ${_flags}")
      endif()
    endif()
  endforeach()
endif()

if(ROPE_DISPATCH STREQUAL "OFF")
  return()
elseif(_rope_dispatch_why)
  if(ROPE_DISPATCH STREQUAL "ON")
    message(FATAL_ERROR "ROPE_DISPATCH=ON, but rope::dispatch cannot be built: ${_rope_dispatch_why}")
  endif()
  message(STATUS "rope::dispatch not built: ${_rope_dispatch_why}")
  return()
endif()

set(_rope_dispatch_dir "${CMAKE_CURRENT_LIST_DIR}/../src/dispatch")
add_library(rope_dispatch "${_rope_dispatch_dir}/dispatch.cpp")
add_library(rope::dispatch ALIAS rope_dispatch)
set_target_properties(rope_dispatch PROPERTIES EXPORT_NAME dispatch POSITION_INDEPENDENT_CODE ON)
target_link_libraries(rope_dispatch PUBLIC rope)
foreach(_isa IN LISTS ROPE_DISPATCH_ISAS)
  set(_source "${_rope_dispatch_dir}/loops_${_isa}.cpp")
  target_sources(rope_dispatch PRIVATE "${_source}")
  set_source_files_properties("${_source}" PROPERTIES COMPILE_OPTIONS "${ROPE_DISPATCH_FLAGS_${_isa}}")
  string(TOUPPER "${_isa}" _upper)
  target_compile_definitions(rope_dispatch PRIVATE ROPE_DISPATCH_HAS_${_upper}=1)
endforeach()
# rope's own warnings and sanitizers when rope builds its tests; not part of
# what is installed.
foreach(_internal rope_warnings rope_sanitizers)
  if(TARGET ${_internal})
    target_link_libraries(rope_dispatch PRIVATE $<BUILD_INTERFACE:${_internal}>)
  endif()
endforeach()
