# Builds and runs a consumer project of rope, as a user would.
#   MODE=find_package:    install rope from ROPE_BINARY_DIR into a scratch
#                         prefix, then build examples/find_package against it.
#   MODE=add_subdirectory: build examples/add_subdirectory, which adds
#                         ROPE_SOURCE_DIR as a subdirectory.
cmake_minimum_required(VERSION 3.16)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

if(MODE STREQUAL "find_package")
  set(prefix "${WORK_DIR}/prefix")
  run(${CMAKE_COMMAND} --install "${ROPE_BINARY_DIR}" --prefix "${prefix}")
  set(source "${ROPE_SOURCE_DIR}/examples/find_package")
  set(extra "-DCMAKE_PREFIX_PATH=${prefix}")
elseif(MODE STREQUAL "add_subdirectory")
  set(source "${ROPE_SOURCE_DIR}/examples/add_subdirectory")
  set(extra "-DROPE_SOURCE_DIR=${ROPE_SOURCE_DIR}")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

run(${CMAKE_COMMAND} -S "${source}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=Release ${extra})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/rope_consumer")
