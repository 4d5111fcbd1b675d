# Checks that scripts/packages names, for each configure preset of
# CMakePresets.json, every Debian package the preset's options need, and that
# the scripts install a preset's packages before they configure it:
#   cmake -DSOURCE_DIR=<rope> -P tests/packages.cmake
# (the CTest case packages.presets; .ci/run runs it first). A failure names
# the preset, the missing package and the option that needs it.
#
# What a preset needs, from its cache variables (after `inherits`) and
# rope's defaults for a top-level build (tests, bench, examples and install
# rules on; BUILD_TESTING, when set, is the default of ROPE_BUILD_TESTS):
#   always                              cmake, libxsimd-dev
#   generator Ninja                     ninja-build
#   CMAKE_CXX_COMPILER clang++          clang (otherwise g++)
#   clang with ROPE_SANITIZE or ROPE_BUILD_FUZZ   libclang-rt-14-dev
#   the aarch64 toolchain file          g++-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user
#   ROPE_ATTENTION=ON, tests or bench   libeigen3-dev
#   ROPE_HF_CONFIG=ON                   nlohmann-json3-dev
#   tests                               libgtest-dev (cross: googletest, the sources)
#   tests + install rules, native       pkg-config (the consumer.pkg_config route)
#   bench                               libbenchmark-dev
cmake_minimum_required(VERSION 3.19)
if(NOT SOURCE_DIR)
  get_filename_component(SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
endif()

file(READ "${SOURCE_DIR}/CMakePresets.json" presets_json)
file(STRINGS "${SOURCE_DIR}/scripts/packages" package_lines REGEX "^[A-Za-z0-9_-]+:")
set(errors "")

# The lines of scripts/packages: packages_<name>.
set(line_names "")
foreach(line IN LISTS package_lines)
  string(REGEX MATCH "^([A-Za-z0-9_-]+):(.*)$" _ "${line}")
  set(name "${CMAKE_MATCH_1}")
  separate_arguments(packages_${name} UNIX_COMMAND "${CMAKE_MATCH_2}")
  list(APPEND line_names ${name})
endforeach()

# A preset's field, following `inherits` (a string or a list; the first
# preset that sets it wins, the preset itself before its parents).
string(JSON preset_count LENGTH "${presets_json}" configurePresets)
math(EXPR last "${preset_count} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${presets_json}" configurePresets ${i} name)
  set(index_${name} ${i})
endforeach()
function(preset_field preset out)  # ARGN: the JSON path under the preset
  set(value "")
  string(JSON value ERROR_VARIABLE err GET "${presets_json}" configurePresets ${index_${preset}} ${ARGN})
  if(err)
    set(value "")
    string(JSON kind ERROR_VARIABLE err TYPE "${presets_json}" configurePresets ${index_${preset}} inherits)
    set(parents "")
    if(kind STREQUAL "STRING")
      string(JSON parents GET "${presets_json}" configurePresets ${index_${preset}} inherits)
    elseif(kind STREQUAL "ARRAY")
      string(JSON n LENGTH "${presets_json}" configurePresets ${index_${preset}} inherits)
      math(EXPR n "${n} - 1")
      foreach(j RANGE ${n})
        string(JSON parent GET "${presets_json}" configurePresets ${index_${preset}} inherits ${j})
        list(APPEND parents ${parent})
      endforeach()
    endif()
    foreach(parent IN LISTS parents)
      preset_field(${parent} value ${ARGN})
      if(NOT value STREQUAL "")
        break()
      endif()
    endforeach()
  else()
    # A cache variable given as {"type": ..., "value": ...}.
    string(JSON inner ERROR_VARIABLE err GET "${value}" value)
    if(NOT err)
      set(value "${inner}")
    endif()
  endif()
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

function(cache preset variable default out)
  preset_field(${preset} value cacheVariables ${variable})
  if(value STREQUAL "")
    set(value "${default}")
  endif()
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

foreach(i RANGE ${last})
  string(JSON preset GET "${presets_json}" configurePresets ${i} name)
  # `hidden` is the preset's own (it is not inherited); JSON true reads as ON.
  string(JSON hidden ERROR_VARIABLE err GET "${presets_json}" configurePresets ${i} hidden)
  if(hidden STREQUAL "ON")
    continue()
  endif()
  if(NOT preset IN_LIST line_names)
    string(APPEND errors "preset ${preset} has no line '${preset}:' in scripts/packages\n")
    continue()
  endif()

  preset_field(${preset} generator generator)
  preset_field(${preset} toolchain toolchainFile)
  cache(${preset} CMAKE_CXX_COMPILER "" compiler)
  cache(${preset} BUILD_TESTING ON build_testing)
  cache(${preset} ROPE_BUILD_TESTS "${build_testing}" tests)
  cache(${preset} ROPE_BUILD_BENCH ON bench)
  cache(${preset} ROPE_BUILD_FUZZ OFF fuzz)
  cache(${preset} ROPE_INSTALL ON install)
  cache(${preset} ROPE_ATTENTION AUTO attention)
  cache(${preset} ROPE_HF_CONFIG AUTO hf_config)
  cache(${preset} ROPE_SANITIZE "" sanitize)

  # needs: "package|why" pairs.
  set(needs "cmake|CMake" "libxsimd-dev|xsimd, always")
  if(generator STREQUAL "Ninja")
    list(APPEND needs "ninja-build|generator Ninja")
  endif()
  set(cross OFF)
  if(toolchain MATCHES "aarch64")
    set(cross ON)
    list(APPEND needs "g++-aarch64-linux-gnu|toolchain ${toolchain}" "libc6-dev-arm64-cross|toolchain ${toolchain}"
                      "qemu-user|toolchain ${toolchain}")
  elseif(compiler MATCHES "clang")
    list(APPEND needs "clang|CMAKE_CXX_COMPILER=${compiler}")
    if(sanitize)
      list(APPEND needs "libclang-rt-14-dev|ROPE_SANITIZE=${sanitize} with clang")
    endif()
    if(fuzz)
      list(APPEND needs "libclang-rt-14-dev|ROPE_BUILD_FUZZ=${fuzz} (libFuzzer)")
    endif()
  else()
    list(APPEND needs "g++|CMAKE_CXX_COMPILER=${compiler} (default: g++)")
  endif()
  if(attention STREQUAL "ON")
    list(APPEND needs "libeigen3-dev|ROPE_ATTENTION=ON")
  endif()
  if(hf_config STREQUAL "ON")
    list(APPEND needs "nlohmann-json3-dev|ROPE_HF_CONFIG=ON")
  endif()
  if(tests)
    list(APPEND needs "libeigen3-dev|ROPE_BUILD_TESTS=${tests} (test_apply, test_half)")
    if(cross)
      list(APPEND needs "googletest|ROPE_BUILD_TESTS=${tests}, cross-compiled")
    else()
      list(APPEND needs "libgtest-dev|ROPE_BUILD_TESTS=${tests}")
      if(install)
        list(APPEND needs "pkg-config|ROPE_BUILD_TESTS=${tests} and ROPE_INSTALL=${install} (consumer.pkg_config)")
      endif()
    endif()
  endif()
  if(bench)
    list(APPEND needs "libbenchmark-dev|ROPE_BUILD_BENCH=${bench}" "libeigen3-dev|ROPE_BUILD_BENCH=${bench}")
  endif()

  foreach(need IN LISTS needs)
    string(REPLACE "|" ";" need "${need}")
    list(GET need 0 package)
    list(GET need 1 why)
    if(NOT package IN_LIST packages_${preset})
      string(APPEND errors "scripts/packages, line ${preset}: lacks ${package}, which preset ${preset} needs (${why})\n")
    endif()
  endforeach()
endforeach()

# Stages of scripts/check.sh that configure no CMake preset (they read their
# line all the same): the format check.
set(stages_without_preset format)
foreach(name IN LISTS line_names)
  if(NOT DEFINED index_${name} AND NOT name IN_LIST stages_without_preset)
    string(APPEND errors "scripts/packages: line ${name} names no configure preset\n")
  endif()
endforeach()

# Every script that configures a preset installs that preset's line first:
# `cmake --preset X` and `deps.sh X` with the same X (a name or a variable).
file(GLOB scripts "${SOURCE_DIR}/scripts/*.sh" "${SOURCE_DIR}/.ci/run")
foreach(script IN LISTS scripts)
  file(READ "${script}" text)
  string(REGEX MATCHALL "cmake --preset [^ \n]+" configures "${text}")
  foreach(configure IN LISTS configures)
    string(REGEX REPLACE "^cmake --preset " "" preset "${configure}")
    string(FIND "${text}" "deps.sh ${preset}" at)
    string(FIND "${text}" "${configure}" configure_at)
    if(at EQUAL -1 OR at GREATER configure_at)
      file(RELATIVE_PATH shown "${SOURCE_DIR}" "${script}")
      string(APPEND errors "${shown}: runs 'cmake --preset ${preset}' without 'bash scripts/deps.sh ${preset}' before it\n")
    endif()
  endforeach()
endforeach()

if(errors)
  message(FATAL_ERROR "rope's package lists do not cover its presets:\n${errors}")
endif()
list(LENGTH line_names n)
message(STATUS "scripts/packages covers the ${n} configure presets and the scripts that configure them")
