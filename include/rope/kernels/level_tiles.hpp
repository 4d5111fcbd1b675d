// rope/kernels/level_tiles.hpp — a cascade level's two products on AMX
// tiles (Intel Sapphire Rapids and later), for the bf16 product mode over
// a bf16 cache (attention/cascade_tiles.hpp):
//
//   tile_scores:  st[j * rs + r] = sum_c keys[j * dk + c] q_rc          (j < keys, r < rows)
//   tile_values:  acc[r * da + c] += sum_j wt[r * kw + j] v_jc           (r < rows, c < da, j < keys)
//
// tdpbf16ps multiplies a tile of 16 rows x 32 bf16 by one of 32 x 16 bf16
// held in pairs (a row of the second tile holds two consecutive k of 16
// columns side by side) and adds the products into 16 x 16 floats. So the
// operands are packed as it reads them: the keys as stored (rows of bf16,
// channels zero-padded to dk, a multiple of 32); q in pairs of channels,
// qv[(c / 2) * rows * 2 + r * 2 + c % 2]; the values in pairs of keys,
// vv[(j / 2) * da * 2 + c * 2 + j % 2]; the weights rounded to bf16, a
// row's keys side by side (wt, kw per row). Every count here is a multiple
// of 32 (keys, rows, dk, da): the kernels take 2 x 2 tiles of 16 at a time
// (tmm0-3 the sums, tmm4-5 the first operand, tmm6-7 the second).
//
// The instruction multiplies bf16 pairs exactly, adds into float in an
// order its documentation leaves open, reads subnormal inputs as zero and
// flushes subnormal results (Intel SDM, TDPBF16PS): its sums are bounded,
// not reproduced (docs/attention.md, "Product modes"). Written as inline
// assembly, which every assembler of the toolchains rope supports takes
// without -mamx-*, in AVX-512BW code only (the packing uses AVX-512BW and
// vcvtne2ps2bf16); amx_bf16_runs asks the CPU and, on Linux, the kernel for
// the tiles once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "../detail/half_lanes.hpp"
#include "../detail/inline.hpp"
#include "../detail/xsimd.hpp"

namespace rope {
namespace detail {

// Whether Arch's code may hold the tile kernels: the AVX-512BW code that
// may hold vcvtne2ps2bf16 (half_lanes.hpp), on Linux, where the kernel
// hands out the tile state.
template <class Arch>
constexpr bool kTilesArch =
#if defined(__linux__)
    kBFloat16HardwareArch<Arch>;
#else
    false;
#endif

// Whether the running CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits
// 24 and 22) and AVX512-BF16, and the kernel granted this process the tile
// state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, Linux 5.16 and
// later), asked once.
template <class Arch>
bool amx_bf16_runs() noexcept {
#if defined(__linux__) && defined(__x86_64__) && defined(__GNUC__)
  static const bool runs = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    if ((d & (1u << 24)) == 0 || (d & (1u << 22)) == 0) return false;
    if (!avx512_bf16_runs<Arch>()) return false;
    constexpr long kRequestPermission = 0x1023, kTileData = 18;
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return runs;
#else
  return false;
#endif
}

// Whether the tiles may be used where they run (the bench turns them off
// to time the bf16 mode's other path on one machine).
inline bool& tiles_allowed() noexcept {
  static bool allowed = true;
  return allowed;
}

// Rows of 16, columns of 32 bf16 (64 bytes): every tile the kernels use.
constexpr std::size_t kTileRows = 16, kTileBf16 = 32;

// n rounded up to the kernels' unit, a pair of tiles (32): their counts of
// keys, rows and channels.
ROPE_ALWAYS_INLINE std::size_t tile_span(std::size_t n) noexcept {
  return (n + 2 * kTileRows - 1) / (2 * kTileRows) * (2 * kTileRows);
}

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)

// The tile state of one thread, configured for the kernels (tmm0-7, each
// 16 rows of 64 bytes) while it lives, released after. Every function here
// is a template on the architecture whose code holds it, like everything
// rope::dispatch compiles once per instruction set (no AVX-512 object may
// define a symbol that baseline code could link to).
template <class Arch>
class TileConfig {
 public:
  TileConfig() noexcept {
    unsigned char config[64] = {};
    config[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      config[16 + 2 * t] = 64;  // bytes per row
      config[48 + t] = kTileRows;
    }
    __asm__ volatile("ldtilecfg %0" : : "m"(config));
  }
  ~TileConfig() { __asm__ volatile("tilerelease" ::: "memory"); }
  TileConfig(const TileConfig&) = delete;
  TileConfig& operator=(const TileConfig&) = delete;
};

#define ROPE_TILE_LOAD(t, p, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"(p), "r"(static_cast<long>(stride)) : "memory")
#define ROPE_TILE_STORE(t, p, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" : : "r"(p), "r"(static_cast<long>(stride)) : "memory")
#define ROPE_TILE_DOT(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

// One step of the 2 x 2 sums in tmm0-3: the first operand's tiles at a0
// and a1 (rows `as` bytes apart) times the second's at b0 and b1 (`bs`
// apart): tmm0 += a0 b0, tmm1 += a0 b1, tmm2 += a1 b0, tmm3 += a1 b1.
template <class Arch>
ROPE_ALWAYS_INLINE void tile_step(const void* a0, const void* a1, std::size_t as, const void* b0, const void* b1,
                                  std::size_t bs) noexcept {
  ROPE_TILE_LOAD(4, a0, as);
  ROPE_TILE_LOAD(5, a1, as);
  ROPE_TILE_LOAD(6, b0, bs);
  ROPE_TILE_LOAD(7, b1, bs);
  ROPE_TILE_DOT(0, 4, 6);
  ROPE_TILE_DOT(1, 4, 7);
  ROPE_TILE_DOT(2, 5, 6);
  ROPE_TILE_DOT(3, 5, 7);
}

// The 2 x 2 sums stored to rows p0 and p1 (tmm0, tmm2) and 16 floats on
// (tmm1, tmm3), each tile's rows `stride` bytes apart.
template <class Arch>
ROPE_ALWAYS_INLINE void tile_sums_store(float* p0, float* p1, std::size_t stride) noexcept {
  ROPE_TILE_STORE(0, p0, stride);
  ROPE_TILE_STORE(1, p0 + kTileRows, stride);
  ROPE_TILE_STORE(2, p1, stride);
  ROPE_TILE_STORE(3, p1 + kTileRows, stride);
}

// st[j * rs + r] = sum_c keys[j * dk + c] q_rc for j < keys, r < rows (see
// the header comment; a TileConfig alive on this thread).
template <class Arch>
void tile_scores(const std::uint16_t* keys, std::size_t dk, std::size_t n, const std::uint16_t* qv, std::size_t rows,
                 float* st, std::size_t rs) noexcept {
  for (std::size_t j = 0; j < n; j += 2 * kTileRows) {
    for (std::size_t r = 0; r < rows; r += 2 * kTileRows) {
      __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::);
      for (std::size_t c = 0; c < dk; c += kTileBf16) {
        const std::uint16_t* q = qv + (c / 2) * rows * 2 + r * 2;
        tile_step<Arch>(keys + j * dk + c, keys + (j + kTileRows) * dk + c, dk * 2, q, q + kTileRows * 2, rows * 4);
      }
      tile_sums_store<Arch>(st + j * rs + r, st + (j + kTileRows) * rs + r, rs * 4);
    }
  }
}

// acc[r * da + c] += sum_j wt[r * kw + j] v_jc for r < rows, c < da, j < n
// (see the header comment; a TileConfig alive on this thread).
template <class Arch>
void tile_values(const std::uint16_t* wt, std::size_t kw, std::size_t n, const std::uint16_t* vv, std::size_t da,
                 std::size_t rows, float* acc) noexcept {
  const std::size_t as = da * 4;
  for (std::size_t r = 0; r < rows; r += 2 * kTileRows) {
    for (std::size_t c = 0; c < da; c += 2 * kTileRows) {
      float* a0 = acc + r * da + c;
      float* a1 = acc + (r + kTileRows) * da + c;
      ROPE_TILE_LOAD(0, a0, as);
      ROPE_TILE_LOAD(1, a0 + kTileRows, as);
      ROPE_TILE_LOAD(2, a1, as);
      ROPE_TILE_LOAD(3, a1 + kTileRows, as);
      for (std::size_t j = 0; j < n; j += kTileBf16) {
        const std::uint16_t* v = vv + (j / 2) * da * 2 + c * 2;
        tile_step<Arch>(wt + r * kw + j, wt + (r + kTileRows) * kw + j, kw * 2, v, v + kTileRows * 2, da * 4);
      }
      tile_sums_store<Arch>(a0, a1, as);
    }
  }
}

#undef ROPE_TILE_LOAD
#undef ROPE_TILE_STORE
#undef ROPE_TILE_DOT

// Two stored rows a and b of dv bf16 (b null: zeros) into the pairs of
// vv: out[2c] = a[c], out[2c + 1] = b[c] for c < da, zero past dv.
template <class Arch>
void pair_rows(const std::uint16_t* a, const std::uint16_t* b, std::size_t dv, std::size_t da,
               std::uint16_t* out) noexcept {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                      36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (std::size_t c = 0; c < da; c += 32) {
    const std::size_t left = c < dv ? dv - c : 0;
    const __mmask32 m = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((std::uint64_t{1} << left) - 1);
    const __m512i x = _mm512_maskz_loadu_epi16(m, a + c);
    const __m512i y = b != nullptr ? _mm512_maskz_loadu_epi16(m, b + c) : _mm512_setzero_si512();
    _mm512_storeu_si512(out + 2 * c, _mm512_permutex2var_epi16(x, lo, y));
    _mm512_storeu_si512(out + 2 * c + 32, _mm512_permutex2var_epi16(x, hi, y));
  }
}

// The weights of keys j < n (st[j * rs + r], r < rows) into wt[r * kw + j]
// rounded to bf16 to nearest even (vcvtne2ps2bf16: a subnormal weight
// reads as zero), zero for n <= j < kw.
template <class Arch>
void pack_weights(const float* st, std::size_t rs, std::size_t n, std::size_t rows, std::uint16_t* wt,
                  std::size_t kw) noexcept {
  std::memset(wt, 0, rows * kw * sizeof(std::uint16_t));
  // Dword i of a pair's 32 words: key j's weight of row i, then key j + 1's.
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i rows_apart = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32(static_cast<int>(kw / 2)));
  auto* words = reinterpret_cast<int*>(wt);
  for (std::size_t j = 0; j < n; j += 2) {
    for (std::size_t r = 0; r < rows; r += 16) {
      const __m512 a = _mm512_loadu_ps(st + j * rs + r);
      const __m512 b = j + 1 < n ? _mm512_loadu_ps(st + (j + 1) * rs + r) : _mm512_setzero_ps();
      __m512i both;  // a's 16 bf16 in the low half, b's in the high half
      __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(both) : "v"(b), "v"(a));
      _mm512_i32scatter_epi32(words + r * (kw / 2) + j / 2, rows_apart, _mm512_permutexvar_epi16(order, both), 4);
    }
  }
}

#endif

}  // namespace detail
}  // namespace rope
