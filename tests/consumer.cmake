# Builds and runs a consumer project of rope, as a user would (cmake -P).
#   MODE=install            install rope from ROPE_BINARY_DIR into PREFIX
#   MODE=install_unbuilt    configure rope as a packager does
#                           (-DBUILD_TESTING=OFF, defaults otherwise) and
#                           install it with nothing built; then configure
#                           tests/consumers/find_package against that prefix (ARGS)
#   MODE=find_package       build tests/consumers/find_package against PREFIX and run
#                           its programs; ARGS passes cache entries, e.g.
#                           -DROPE_CONSUMER_VERSION=1.0
#   MODE=add_subdirectory   build tests/consumers/add_subdirectory (rope vendored)
#   MODE=fetch_content      build tests/consumers/fetch_content (FetchContent, local)
#   MODE=warnings           build tests/consumers/warnings against PREFIX with
#                           every warning an error, with CXX and with the
#                           other of g++ and clang++ where it is installed,
#                           and run its programs
#   MODE=pkg_config         compile the consumer programs with nothing but
#                           `pkg-config --cflags --libs` of the installed .pc
#                           files
# CONFIGURE_ONLY=ON: configure the project, build nothing (what a package's
# find_package call accepts is decided there).
# EXPECT_FAILURE=ON: the configure step must fail (a refused version, a
# missing component); FAILURE_MATCH: text its output must contain.
# XSIMD_INCLUDE_DIR: the xsimd headers rope was configured with
# (ROPE_XSIMD_INCLUDE_DIR); the consumer builds against them too: through
# rope's own switch when it embeds rope, through a stand-in for an installed
# xsimd (a package config and a .pc file) when it finds rope installed.
cmake_minimum_required(VERSION 3.16)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

function(run_programs dir)
  foreach(program rope_consumer rope_consumer_attention rope_consumer_hf_config rope_consumer_dispatch)
    if(EXISTS "${dir}/${program}")
      run("${dir}/${program}")
    elseif(program STREQUAL "rope_consumer")
      message(FATAL_ERROR "${dir}/${program} was not built")
    endif()
  endforeach()
endfunction()

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE "${PREFIX}")
  run(${CMAKE_COMMAND} --install "${ROPE_BINARY_DIR}" --prefix "${PREFIX}")
  return()
endif()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# An installed xsimd whose headers are XSIMD_INCLUDE_DIR, as find_package and
# pkg-config see one: what rope's installed config and .pc file ask for.
set(xsimd_stand_in "${WORK_DIR}/xsimd")
if(XSIMD_INCLUDE_DIR)
  file(WRITE "${xsimd_stand_in}/xsimdConfig.cmake"
    "add_library(xsimd INTERFACE IMPORTED)\n"
    "set_target_properties(xsimd PROPERTIES INTERFACE_INCLUDE_DIRECTORIES \"${XSIMD_INCLUDE_DIR}\")\n")
  file(WRITE "${xsimd_stand_in}/xsimd.pc"
    "Name: xsimd\nDescription: xsimd headers in ${XSIMD_INCLUDE_DIR}\nVersion: 0\n"
    "Cflags: -I${XSIMD_INCLUDE_DIR}\n")
endif()

if(MODE STREQUAL "install_unbuilt")
  # The headers alone need no build; BUILD_TESTING=OFF turns rope's tests off.
  set(rope_configure ${CMAKE_COMMAND} -S "${ROPE_SOURCE_DIR}" -B "${WORK_DIR}/rope" -G "${GENERATOR}"
      "-DCMAKE_CXX_COMPILER=${CXX}" -DBUILD_TESTING=OFF)
  if(XSIMD_INCLUDE_DIR)
    list(APPEND rope_configure "-DROPE_XSIMD_INCLUDE_DIR=${XSIMD_INCLUDE_DIR}")
  endif()
  run(${rope_configure})
  file(STRINGS "${WORK_DIR}/rope/CMakeCache.txt" tests_option REGEX "^ROPE_BUILD_TESTS:")
  if(NOT tests_option STREQUAL "ROPE_BUILD_TESTS:BOOL=OFF")
    message(FATAL_ERROR "-DBUILD_TESTING=OFF left ${tests_option}")
  endif()
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/rope" --prefix "${WORK_DIR}/prefix")
  set(PREFIX "${WORK_DIR}/prefix")
  set(MODE find_package)
  set(CONFIGURE_ONLY ON)
endif()

if(MODE STREQUAL "pkg_config")
  set(ENV{PKG_CONFIG_PATH} "${PREFIX}/share/pkgconfig")
  if(XSIMD_INCLUDE_DIR)
    set(ENV{PKG_CONFIG_PATH} "${xsimd_stand_in}:$ENV{PKG_CONFIG_PATH}")
  endif()
  # Each program with the package it needs: consumer -> rope,
  # consumer_attention -> rope-attention, and so on.
  set(programs consumer consumer_attention)
  foreach(part hf_config dispatch)
    string(REPLACE "_" "-" package "rope-${part}")
    if(EXISTS "${PREFIX}/share/pkgconfig/${package}.pc")
      list(APPEND programs consumer_${part})
    endif()
  endforeach()
  foreach(program IN LISTS programs)
    string(REPLACE "consumer" "rope" package "${program}")
    string(REPLACE "_" "-" package "${package}")
    execute_process(COMMAND pkg-config --cflags --libs ${package} OUTPUT_VARIABLE flags RESULT_VARIABLE rc
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "pkg-config --cflags --libs ${package} failed (${rc})")
    endif()
    message(STATUS "pkg-config --cflags --libs ${package}: ${flags}")
    separate_arguments(flags UNIX_COMMAND "${flags}")
    run(${CXX} -std=c++17 -O1 "${ROPE_SOURCE_DIR}/tests/consumers/${program}.cpp" ${flags}
        -o "${WORK_DIR}/rope_${program}")
  endforeach()
  run_programs("${WORK_DIR}")
  return()
endif()

if(MODE STREQUAL "warnings")
  # CXX, and g++ and clang++ where installed, each once (c++ may be g++).
  set(compilers "${CXX}")
  get_filename_component(seen "${CXX}" REALPATH)
  foreach(other g++ clang++)
    find_program(other_path ${other})
    if(other_path)
      get_filename_component(real "${other_path}" REALPATH)
      if(NOT real IN_LIST seen)
        list(APPEND compilers "${other_path}")
        list(APPEND seen "${real}")
      endif()
    endif()
    unset(other_path CACHE)
  endforeach()
  foreach(compiler IN LISTS compilers)
    get_filename_component(name "${compiler}" NAME)
    set(build "${WORK_DIR}/build-${name}")
    set(configure ${CMAKE_COMMAND} -S "${ROPE_SOURCE_DIR}/tests/consumers/warnings" -B "${build}" -G "${GENERATOR}"
        "-DCMAKE_CXX_COMPILER=${compiler}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${PREFIX}")
    if(XSIMD_INCLUDE_DIR)
      list(APPEND configure "-Dxsimd_DIR=${xsimd_stand_in}")
    endif()
    message(STATUS "warnings as errors with ${compiler}")
    run(${configure})
    run(${CMAKE_COMMAND} --build "${build}")
    run("${build}/rope_consumer_warnings_native")
    run("${build}/rope_consumer_warnings_baseline")
  endforeach()
  return()
endif()

if(MODE STREQUAL "find_package")
  set(source "${ROPE_SOURCE_DIR}/tests/consumers/find_package")
  set(extra "-DCMAKE_PREFIX_PATH=${PREFIX}")
  if(XSIMD_INCLUDE_DIR)
    list(APPEND extra "-Dxsimd_DIR=${xsimd_stand_in}")
  endif()
elseif(MODE STREQUAL "add_subdirectory" OR MODE STREQUAL "fetch_content")
  set(source "${ROPE_SOURCE_DIR}/tests/consumers/${MODE}")
  set(extra "-DROPE_SOURCE_DIR=${ROPE_SOURCE_DIR}")
  if(XSIMD_INCLUDE_DIR)
    list(APPEND extra "-DROPE_XSIMD_INCLUDE_DIR=${XSIMD_INCLUDE_DIR}")
  endif()
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
separate_arguments(args UNIX_COMMAND "${ARGS}")

set(configure ${CMAKE_COMMAND} -S "${source}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=Release ${extra} ${args})
if(EXPECT_FAILURE)
  execute_process(COMMAND ${configure} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "configuring ${source} with ${ARGS} succeeded; it must fail")
  endif()
  if(FAILURE_MATCH AND NOT "${out}${err}" MATCHES "${FAILURE_MATCH}")
    message(FATAL_ERROR "configure failed, but not with '${FAILURE_MATCH}':\n${out}${err}")
  endif()
  message(STATUS "refused as expected: ${FAILURE_MATCH}")
  return()
endif()
run(${configure})
if(CONFIGURE_ONLY)
  message(STATUS "the package loads as asked: ${ARGS}")
  return()
endif()
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_programs("${WORK_DIR}/build")
