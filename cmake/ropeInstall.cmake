# Install rules: the headers, one CMake package with a component per optional
# part, and a pkg-config file per part.
#
#   find_package(rope 0.1 CONFIG REQUIRED)                       rope::rope, rope::native
#   find_package(rope 0.1 CONFIG REQUIRED COMPONENTS attention)  + rope::attention
#   find_package(rope 0.1 CONFIG REQUIRED COMPONENTS hf_config)  + rope::hf_config
#
# Each part has its own export file, loaded by ropeConfig.cmake only when its
# dependency is there, so a user without Eigen (or nlohmann_json) can find
# and use the core.
include(CMakePackageConfigHelpers)
set(ROPE_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/rope")
set(ROPE_PKGCONFIG_DIR "${CMAKE_INSTALL_DATADIR}/pkgconfig")

install(DIRECTORY include/rope DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS rope rope_native EXPORT ropeTargets)
install(EXPORT ropeTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
set(ROPE_COMPONENTS "")
if(TARGET rope_attention)
  install(TARGETS rope_attention EXPORT ropeAttentionTargets)
  install(EXPORT ropeAttentionTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
  list(APPEND ROPE_COMPONENTS attention)
endif()
if(TARGET rope_hf_config)
  install(TARGETS rope_hf_config EXPORT ropeHfConfigTargets)
  install(EXPORT ropeHfConfigTargets NAMESPACE rope:: DESTINATION "${ROPE_CMAKE_DIR}")
  list(APPEND ROPE_COMPONENTS hf_config)
endif()

configure_package_config_file(cmake/ropeConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/ropeConfig.cmake"
  INSTALL_DESTINATION "${ROPE_CMAKE_DIR}")
# Before 1.0 a minor version may break the API: 0.1 accepts 0.1.x only.
# ARCH_INDEPENDENT: headers only, one install serves every architecture.
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/ropeConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  "${CMAKE_CURRENT_BINARY_DIR}/ropeConfig.cmake"
  "${CMAKE_CURRENT_BINARY_DIR}/ropeConfigVersion.cmake"
  cmake/ropeXtlShim.cmake
  DESTINATION "${ROPE_CMAKE_DIR}")

# pkg-config: Cflags only (header-only); the dependencies by their own .pc
# names, as Debian installs them (xsimd.pc, eigen3.pc, nlohmann_json.pc). The prefix is found
# from the .pc file's own folder, so the files hold wherever the package is
# installed (cmake --install --prefix, a staging directory).
file(RELATIVE_PATH ROPE_PC_TO_PREFIX "/prefix/${ROPE_PKGCONFIG_DIR}" "/prefix")
string(REGEX REPLACE "/$" "" ROPE_PC_TO_PREFIX "${ROPE_PC_TO_PREFIX}")
configure_file(cmake/rope.pc.in "${CMAKE_CURRENT_BINARY_DIR}/rope.pc" @ONLY)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/rope.pc" DESTINATION "${ROPE_PKGCONFIG_DIR}")
if(TARGET rope_attention)
  configure_file(cmake/rope-attention.pc.in "${CMAKE_CURRENT_BINARY_DIR}/rope-attention.pc" @ONLY)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/rope-attention.pc" DESTINATION "${ROPE_PKGCONFIG_DIR}")
endif()
if(TARGET rope_hf_config)
  configure_file(cmake/rope-hf-config.pc.in "${CMAKE_CURRENT_BINARY_DIR}/rope-hf-config.pc" @ONLY)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/rope-hf-config.pc" DESTINATION "${ROPE_PKGCONFIG_DIR}")
endif()
