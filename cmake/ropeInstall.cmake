# Install rules: the headers, one CMake package with a component per optional
# part, and a pkg-config file per part.
#
#   find_package(rope 0.1 CONFIG REQUIRED)                       rope::rope, rope::native
#   find_package(rope 0.1 CONFIG REQUIRED COMPONENTS attention)  + rope::attention
#   find_package(rope 0.1 CONFIG REQUIRED COMPONENTS hf_config)  + rope::hf_config
#   find_package(rope 0.1 CONFIG REQUIRED COMPONENTS dispatch)   + rope::dispatch
#
# Each part has its own export file, loaded by ropeConfig.cmake only when its
# dependency is there, so a user without Eigen (or nlohmann_json) can find
# and use the core.
# rope::dispatch and, with ROPE_HF_CONFIG_LIBRARY or ROPE_ATTENTION_LIBRARY, the
# config reader and the attention library are the compiled parts: libraries (static unless BUILD_SHARED_LIBS) under the
# library directory, exported with their locations.
include(CMakePackageConfigHelpers)
set(ROPE_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/rope")
set(ROPE_PKGCONFIG_DIR "${CMAKE_INSTALL_DATADIR}/pkgconfig")

# Configured with a compiled part (rope::dispatch, the config reader
# library), an install before the build would stop halfway on a missing file
# without saying why: stop first, saying it.
if(TARGET rope_dispatch)
  install(CODE "
    if(NOT EXISTS \"$<TARGET_FILE:rope_dispatch>\")
      message(FATAL_ERROR \"rope: rope::dispatch (ROPE_DISPATCH=${ROPE_DISPATCH}) is not built: run 'cmake --build ${CMAKE_BINARY_DIR}' before 'cmake --install', or configure with -DROPE_DISPATCH=OFF for the headers alone\")
    endif()")
endif()
if(TARGET rope_attention_library)
  install(CODE "
    if(NOT EXISTS \"$<TARGET_FILE:rope_attention_library>\")
      message(FATAL_ERROR \"rope: the attention library (ROPE_ATTENTION_LIBRARY=ON) is not built: run 'cmake --build ${CMAKE_BINARY_DIR}' before 'cmake --install', or configure with -DROPE_ATTENTION_LIBRARY=OFF for the headers alone\")
    endif()")
endif()
if(TARGET rope_hf_config_reader)
  install(CODE "
    if(NOT EXISTS \"$<TARGET_FILE:rope_hf_config_reader>\")
      message(FATAL_ERROR \"rope: the config reader library (ROPE_HF_CONFIG_LIBRARY=ON) is not built: run 'cmake --build ${CMAKE_BINARY_DIR}' before 'cmake --install', or configure with -DROPE_HF_CONFIG_LIBRARY=OFF for the headers alone\")
    endif()")
endif()
install(DIRECTORY include/rope DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS rope rope_native EXPORT ropeTargets)
install(EXPORT ropeTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
set(ROPE_COMPONENTS "")
if(TARGET rope_attention_library)
  install(TARGETS rope_attention rope_attention_library EXPORT ropeAttentionTargets
    ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
    LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
    RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
  install(EXPORT ropeAttentionTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
  list(APPEND ROPE_COMPONENTS attention)
elseif(TARGET rope_attention)
  install(TARGETS rope_attention EXPORT ropeAttentionTargets)
  install(EXPORT ropeAttentionTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
  list(APPEND ROPE_COMPONENTS attention)
endif()
if(TARGET rope_hf_config_reader)
  install(TARGETS rope_hf_config rope_hf_config_reader EXPORT ropeHfConfigTargets
    ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
    LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
    RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
  install(EXPORT ropeHfConfigTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
  list(APPEND ROPE_COMPONENTS hf_config)
elseif(TARGET rope_hf_config)
  install(TARGETS rope_hf_config EXPORT ropeHfConfigTargets)
  install(EXPORT ropeHfConfigTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
  list(APPEND ROPE_COMPONENTS hf_config)
endif()
if(TARGET rope_dispatch)
  install(TARGETS rope_dispatch EXPORT ropeDispatchTargets
    ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
    LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
    RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
  install(EXPORT ropeDispatchTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
  list(APPEND ROPE_COMPONENTS dispatch)
endif()

configure_package_config_file(cmake/ropeConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/ropeConfig.cmake"
  INSTALL_DESTINATION "${ROPE_CMAKE_DIR}")
# Before 1.0 a minor version may break the API: 0.1 accepts 0.1.x only.
# Headers alone serve every architecture (ARCH_INDEPENDENT); with a compiled
# part (rope::dispatch, the config reader library) the package is for the
# pointer size it was built for.
if(TARGET rope_dispatch OR TARGET rope_hf_config_reader OR TARGET rope_attention_library)
  set(_rope_arch_independent "")
else()
  set(_rope_arch_independent ARCH_INDEPENDENT)
endif()
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/ropeConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ${_rope_arch_independent})
install(FILES
  "${CMAKE_CURRENT_BINARY_DIR}/ropeConfig.cmake"
  "${CMAKE_CURRENT_BINARY_DIR}/ropeConfigVersion.cmake"
  cmake/ropeXtlShim.cmake
  DESTINATION "${ROPE_CMAKE_DIR}")

# pkg-config: Cflags (and Libs for a compiled part); the dependencies by their own .pc
# names, as Debian installs them (xsimd.pc, eigen3.pc, nlohmann_json.pc). The prefix is found
# from the .pc file's own folder, so the files hold wherever the package is
# installed (cmake --install --prefix, a staging directory).
file(RELATIVE_PATH ROPE_PC_TO_PREFIX "/prefix/${ROPE_PKGCONFIG_DIR}" "/prefix")
string(REGEX REPLACE "/$" "" ROPE_PC_TO_PREFIX "${ROPE_PC_TO_PREFIX}")
configure_file(cmake/rope.pc.in "${CMAKE_CURRENT_BINARY_DIR}/rope.pc" @ONLY)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/rope.pc" DESTINATION "${ROPE_PKGCONFIG_DIR}")
if(TARGET rope_attention_library)
  set(ROPE_ATTENTION_PC_LIBS "Libs: -L\${libdir} -lrope_attention_library")
  set(ROPE_ATTENTION_PC_CFLAGS " -DROPE_ATTENTION_LIBRARY=1")
else()
  set(ROPE_ATTENTION_PC_LIBS "")
  set(ROPE_ATTENTION_PC_CFLAGS "")
endif()
if(TARGET rope_attention)
  configure_file(cmake/rope-attention.pc.in "${CMAKE_CURRENT_BINARY_DIR}/rope-attention.pc" @ONLY)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/rope-attention.pc" DESTINATION "${ROPE_PKGCONFIG_DIR}")
endif()
if(TARGET rope_hf_config_reader)
  set(ROPE_HF_CONFIG_PC_LIBS "Libs: -L\${libdir} -lrope_hf_config_reader")
  set(ROPE_HF_CONFIG_PC_CFLAGS " -DROPE_HF_CONFIG_LIBRARY=1")
else()
  set(ROPE_HF_CONFIG_PC_LIBS "")
  set(ROPE_HF_CONFIG_PC_CFLAGS "")
endif()
if(TARGET rope_hf_config)
  configure_file(cmake/rope-hf-config.pc.in "${CMAKE_CURRENT_BINARY_DIR}/rope-hf-config.pc" @ONLY)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/rope-hf-config.pc" DESTINATION "${ROPE_PKGCONFIG_DIR}")
endif()
if(TARGET rope_dispatch)
  configure_file(cmake/rope-dispatch.pc.in "${CMAKE_CURRENT_BINARY_DIR}/rope-dispatch.pc" @ONLY)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/rope-dispatch.pc" DESTINATION "${ROPE_PKGCONFIG_DIR}")
endif()
