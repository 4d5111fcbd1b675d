# Builds and runs a consumer project of rope, as a user would (cmake -P).
#   MODE=install            install rope from ROPE_BINARY_DIR into PREFIX
#   MODE=find_package       build examples/find_package against PREFIX and run
#                           its programs; ARGS passes cache entries, e.g.
#                           -DROPE_CONSUMER_VERSION=1.0
#   MODE=add_subdirectory   build examples/add_subdirectory (rope vendored)
#   MODE=fetch_content      build examples/fetch_content (FetchContent, local)
#   MODE=pkg_config         compile the consumer programs with nothing but
#                           `pkg-config --cflags --libs` of the installed .pc
#                           files
# EXPECT_FAILURE=ON: the configure step must fail (a refused version, a
# missing component); FAILURE_MATCH: text its output must contain.
cmake_minimum_required(VERSION 3.16)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

function(run_programs dir)
  foreach(program rope_consumer rope_consumer_attention rope_consumer_dispatch)
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

if(MODE STREQUAL "pkg_config")
  set(ENV{PKG_CONFIG_PATH} "${PREFIX}/share/pkgconfig")
  set(pairs "rope:consumer" "rope-attention:consumer_attention")
  if(EXISTS "${PREFIX}/share/pkgconfig/rope-dispatch.pc")
    list(APPEND pairs "rope-dispatch:consumer_dispatch")
  endif()
  foreach(pair IN LISTS pairs)
    string(REPLACE ":" ";" pair "${pair}")
    list(GET pair 0 package)
    list(GET pair 1 program)
    execute_process(COMMAND pkg-config --cflags --libs ${package} OUTPUT_VARIABLE flags RESULT_VARIABLE rc
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "pkg-config --cflags --libs ${package} failed (${rc})")
    endif()
    message(STATUS "pkg-config --cflags --libs ${package}: ${flags}")
    separate_arguments(flags UNIX_COMMAND "${flags}")
    run(${CXX} -std=c++17 -O1 "${ROPE_SOURCE_DIR}/examples/${program}.cpp" ${flags}
        -o "${WORK_DIR}/rope_${program}")
  endforeach()
  run_programs("${WORK_DIR}")
  return()
endif()

if(MODE STREQUAL "find_package")
  set(source "${ROPE_SOURCE_DIR}/examples/find_package")
  set(extra "-DCMAKE_PREFIX_PATH=${PREFIX}")
elseif(MODE STREQUAL "add_subdirectory" OR MODE STREQUAL "fetch_content")
  set(source "${ROPE_SOURCE_DIR}/examples/${MODE}")
  set(extra "-DROPE_SOURCE_DIR=${ROPE_SOURCE_DIR}")
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
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_programs("${WORK_DIR}/build")
