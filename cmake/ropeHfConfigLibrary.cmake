# The checkpoint config reader compiled once (ROPE_HF_CONFIG_LIBRARY, OFF by
# default): rope::hf::parse, from_json and load built into a small library,
# rope_hf_config_reader (exported as rope::hf_config_reader), that
# rope::hf_config links; its users get ROPE_HF_CONFIG_LIBRARY defined, so
# <rope/hf_config.hpp> declares the three functions instead of compiling the
# reader into each of their translation units (docs/hf_config.md, "Compile
# cost").
#
#   ROPE_HF_CONFIG_LIBRARY=OFF  header-only (the default): `cmake --install`
#                               needs no build
#   ROPE_HF_CONFIG_LIBRARY=ON   the library, where rope::hf_config is built;
#                               installed by `cmake --install` after
#                               `cmake --build`
# STATIC unless BUILD_SHARED_LIBS; position-independent either way.
option(ROPE_HF_CONFIG_LIBRARY "Compile rope::hf_config's reader once into a library instead of every user's translation unit" OFF)

if(NOT ROPE_HF_CONFIG_LIBRARY)
  return()
endif()
if(NOT TARGET rope_hf_config)
  message(FATAL_ERROR "ROPE_HF_CONFIG_LIBRARY=ON, but rope::hf_config is not built (ROPE_HF_CONFIG=${ROPE_HF_CONFIG}; it needs nlohmann_json 3)")
endif()

add_library(rope_hf_config_reader "${CMAKE_CURRENT_LIST_DIR}/../src/hf_config/reader.cpp")
add_library(rope::hf_config_reader ALIAS rope_hf_config_reader)
set_target_properties(rope_hf_config_reader PROPERTIES EXPORT_NAME hf_config_reader POSITION_INDEPENDENT_CODE ON)
target_link_libraries(rope_hf_config_reader PUBLIC rope nlohmann_json::nlohmann_json)
target_compile_definitions(rope_hf_config_reader PUBLIC ROPE_HF_CONFIG_LIBRARY=1)
target_link_libraries(rope_hf_config INTERFACE rope_hf_config_reader)
foreach(_internal rope_warnings rope_sanitizers)
  if(TARGET ${_internal})
    target_link_libraries(rope_hf_config_reader PRIVATE $<BUILD_INTERFACE:${_internal}>)
  endif()
endforeach()
