# Cross-compiles rope's tests for 64-bit Arm Linux with Debian's
# g++-aarch64-linux-gnu and runs them under qemu-aarch64 (qemu-user), so an
# x86-64 machine checks the NEON kernels too. The aarch64 preset uses it:
#   cmake --preset aarch64 && cmake --build --preset aarch64 && ctest --preset aarch64
# or by hand:
#   cmake -B build/aarch64 --toolchain cmake/toolchains/aarch64-linux-gnu.cmake \
#         -DROPE_XSIMD_INCLUDE_DIR=/usr/include -DROPE_BUILD_BENCH=OFF
# xsimd and Eigen are header-only, so the host's headers serve (xsimd's CMake
# config sits in the host's library directory, hence ROPE_XSIMD_INCLUDE_DIR).
# Libraries are looked for only under the Arm sysroot, never on the host;
# GoogleTest is built from source with the cross compiler (tests/CMakeLists.txt).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(ROPE_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${ROPE_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${ROPE_CROSS_TRIPLE}-g++)

set(CMAKE_FIND_ROOT_PATH /usr/${ROPE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# ctest (and gtest_discover_tests) run every test binary through this; -L
# points qemu at the Arm dynamic loader and libraries.
find_program(ROPE_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR "${ROPE_QEMU_AARCH64};-L;/usr/${ROPE_CROSS_TRIPLE}")
