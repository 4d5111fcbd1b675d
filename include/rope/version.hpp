// rope/version.hpp — the library's version, as macros and as a constant.
// CMake reads ROPE_VERSION_{MAJOR,MINOR,PATCH} from this file, so it is the
// single place the version is written.
#pragma once

#define ROPE_VERSION_MAJOR 0
#define ROPE_VERSION_MINOR 1
#define ROPE_VERSION_PATCH 0

// One integer that compares in release order: 10203 is 1.2.3.
#define ROPE_VERSION (ROPE_VERSION_MAJOR * 10000 + ROPE_VERSION_MINOR * 100 + ROPE_VERSION_PATCH)

namespace rope {
inline constexpr int kVersion = ROPE_VERSION;
}  // namespace rope
