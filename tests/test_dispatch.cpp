// rope::dispatch, from a program built the way a user's is: baseline flags
// (no -march, no rope::native), linked with rope::dispatch.
//
// What is asserted:
//   - where the CPU has AVX2 with FMA, the instruction set chosen is AVX2 or
//     AVX-512 (elsewhere the test says why it skips); on aarch64, NEON;
//   - for every instruction set this CPU runs, forced, the tensor calls
//     (apply and apply_qk with grouped-query heads, each in place and out of
//     place; apply_mrope with chunked and interleaved sections and with a
//     PairAxes of four axes; apply_axial) give, bit for bit, the result with
//     every rounding spelled out (rounding_oracle.hpp): fused multiply-adds
//     for AVX2, AVX-512 and NEON, separate roundings for SSE2. This is the
//     result of the compile-time build of that instruction set: test_apply
//     checks the compile-time AVX2 and AVX-512 builds against the same
//     oracle, bit for bit, and the SSE2 build is this file's own header-only
//     path, compared directly below. Float, double, BFloat16 and Float16;
//     both pairings and directions; full and partial rotary dims chosen so
//     that rows end on a whole step, on an overlapping last step and shorter
//     than a step for every instruction set; one and two threads; cached and
//     streaming stores;
//   - install, uninstall, force and reset do what they say, and force refuses
//     a name it does not know, naming the choices;
//   - ROPE_DISPATCH_MAX_ISA (the ctest cases dispatch.max_isa and
//     dispatch.max_isa_unknown; the tests skip without it): the sets above
//     the cap leave available(), and force refuses each as built in but not
//     run by this CPU, changing nothing, installed or not; a value that is
//     none of compiled() fails every call that checks the CPU, naming the
//     variable, the value and the choices, and installs nothing;
//   - the operating system's part of "this CPU runs it" (src/dispatch/
//     xcr0.hpp), on XCR0 values of machines this one is not: AVX-512 needs
//     the YMM and every ZMM state saved, AVX2 the YMM state, SSE2 nothing;
//   - forcing while calls run (DispatchThreads, also under ThreadSanitizer):
//     every call of rope::apply on threads of rope's own gives the bytes of
//     one instruction set forced alone, never a mix of two;
//   - attention's decode loop (kernels/kv_decode.hpp, attend_keys) goes through
//     the table too: for every instruction set this CPU runs, forced, over
//     caches of float, bfloat16, float16 and int8, within float rounding of
//     a double recomputation; forced to the baseline, the same bytes as this
//     program's header-only path.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <rope/attention/dispatch_slots.hpp>
#include <rope/dispatch.hpp>
#include <rope/error.hpp>
#include <rope/kernels/kv_rows.hpp>
#include <rope/tensor/dispatch_table.hpp>

#include "pool_keys.hpp"
#include "rounding_oracle.hpp"
#include "xcr0.hpp"

namespace {

bool is_x86_64() {
#if defined(__x86_64__) || defined(_M_X64)
  return true;
#else
  return false;
#endif
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// ROPE_DISPATCH_MAX_ISA (null: unset or empty), which rope::dispatch reads
// once per process: the ctest cases dispatch.max_isa (sse2) and
// dispatch.max_isa_unknown set it and select the DispatchMaxIsa test of
// their value; run without it, both tests skip.
const char* max_isa() {
  const char* value = std::getenv("ROPE_DISPATCH_MAX_ISA");
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// Whether the instruction set computes a*b+c with one rounding.
bool fuses(const std::string& arch) { return arch != "sse2"; }

// Restores the automatic choice, installed, after each test.
class Dispatch : public ::testing::Test {
 protected:
  void TearDown() override { rope::dispatch::reset(); }
};

TEST_F(Dispatch, ThisTestIsBuiltWithBaselineFlags) {
  // The premise of the file: without dispatch, this program would run the
  // baseline instruction set.
  if (is_x86_64()) {
    EXPECT_STREQ(xsimd::default_arch::name(), "sse2");
  } else {
    GTEST_SKIP() << "baseline of this target: " << xsimd::default_arch::name();
  }
}

TEST_F(Dispatch, ChoosesAvx2OrBetterWhereTheCpuHasIt) {
  const auto available = rope::dispatch::available();
  ASSERT_FALSE(available.empty());
  const std::string chosen = rope::dispatch::install();
  EXPECT_EQ(chosen, rope::dispatch::arch());
  EXPECT_EQ(chosen, available.front()) << "the best instruction set this CPU runs comes first";
  if (is_x86_64()) {
    if (!contains(available, "fma3+avx2")) {
      GTEST_SKIP() << "this CPU (or its operating system) has no AVX2 with FMA"
                   << (max_isa() != nullptr ? std::string(", or ROPE_DISPATCH_MAX_ISA=") + max_isa() + " keeps it off"
                                            : std::string())
                   << "; chosen: " << chosen;
    }
    EXPECT_TRUE(chosen == "fma3+avx2" || chosen == "avx512bw") << chosen;
    std::cout << "[ chosen   ] " << chosen << "\n";
  } else {
    EXPECT_EQ(chosen, "arm64+neon");
  }
}

TEST_F(Dispatch, AvailableIsTheCompiledSetsThisCpuRunsBestFirst) {
  const auto compiled = rope::dispatch::compiled();
  const auto available = rope::dispatch::available();
  if (is_x86_64()) {
    EXPECT_EQ(compiled, (std::vector<std::string>{"avx512bw", "fma3+avx2", "sse2"}));
    EXPECT_TRUE(contains(available, "sse2")) << "every x86-64 CPU runs SSE2";
  }
  std::size_t next = 0;  // available keeps compiled's order
  for (const auto& name : available) {
    const auto it = std::find(compiled.begin() + static_cast<std::ptrdiff_t>(next), compiled.end(), name);
    ASSERT_NE(it, compiled.end()) << name;
    next = static_cast<std::size_t>(it - compiled.begin()) + 1;
  }
}

TEST_F(Dispatch, InstallUninstallForceReset) {
  rope::dispatch::uninstall();
  EXPECT_FALSE(rope::dispatch::installed());
  EXPECT_EQ(std::string(rope::dispatch::install()), rope::dispatch::available().front());
  EXPECT_TRUE(rope::dispatch::installed());
  const std::string last = rope::dispatch::available().back();
  rope::dispatch::uninstall();
  rope::dispatch::force(last);
  EXPECT_TRUE(rope::dispatch::installed()) << "force installs";
  EXPECT_EQ(rope::dispatch::arch(), last);
  rope::dispatch::uninstall();
  EXPECT_EQ(std::string(rope::dispatch::install()), last) << "install keeps what force chose";
  rope::dispatch::reset();
  EXPECT_EQ(rope::dispatch::arch(), rope::dispatch::available().front());
}

TEST_F(Dispatch, ForceRefusesUnknownNamesNamingTheChoices) {
  const std::string before = rope::dispatch::arch();
  try {
    rope::dispatch::force("avx2");
    FAIL() << "force(\"avx2\") did not throw";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rope::dispatch::force: name must be one of the instruction sets built in ("),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("got avx2"), std::string::npos) << what;
    for (const auto& name : rope::dispatch::compiled()) EXPECT_NE(what.find(name), std::string::npos) << what;
  }
  EXPECT_EQ(rope::dispatch::arch(), before) << "a refused force changes nothing";
}

TEST(DispatchMaxIsa, SetsAboveTheCapCountAsNotRunByTheCpu) {
  const char* cap = max_isa();
  if (cap == nullptr) GTEST_SKIP() << "ROPE_DISPATCH_MAX_ISA is unset (the ctest case dispatch.max_isa sets it)";
  const auto compiled = rope::dispatch::compiled();
  const auto at = std::find(compiled.begin(), compiled.end(), cap);
  if (at == compiled.end()) GTEST_SKIP() << "ROPE_DISPATCH_MAX_ISA=" << cap << " is built in as none of the choices";
  const std::vector<std::string> above(compiled.begin(), at);
  const auto available = rope::dispatch::available();
  ASSERT_FALSE(available.empty());
  for (const auto& name : above) EXPECT_FALSE(contains(available, name)) << name << " is above the cap " << cap;
  if (is_x86_64() && std::string(cap) == "sse2") {
    EXPECT_EQ(above, (std::vector<std::string>{"avx512bw", "fma3+avx2"}));
    EXPECT_EQ(available, (std::vector<std::string>{"sse2"}));
  }
  EXPECT_EQ(std::string(rope::dispatch::install()), available.front());
  // A set above the cap is refused as one the CPU does not run, installed
  // or not, and the refusal changes nothing.
  for (bool installed : {true, false}) {
    if (!installed) rope::dispatch::uninstall();
    for (const auto& name : above) {
      const std::string before = rope::dispatch::arch();
      try {
        rope::dispatch::force(name);
        ADD_FAILURE() << "force(\"" << name << "\") did not throw under ROPE_DISPATCH_MAX_ISA=" << cap;
      } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("got " + name +
                            " (built in, but this CPU does not run it: above ROPE_DISPATCH_MAX_ISA=" + cap + ")"),
                  std::string::npos)
            << what;
      }
      EXPECT_EQ(rope::dispatch::arch(), before) << "a refused force changes nothing";
      EXPECT_EQ(rope::dispatch::installed(), installed) << "a refused force changes nothing";
      if (installed) {
        EXPECT_EQ(rope::detail::installed_table.load()->arch, before) << "the loop the tensor calls run";
      }
    }
  }
  rope::dispatch::reset();
}

TEST(DispatchMaxIsa, AnUnknownValueFailsEveryCallThatChoosesNamingTheChoices) {
  const char* cap = max_isa();
  if (cap == nullptr)
    GTEST_SKIP() << "ROPE_DISPATCH_MAX_ISA is unset (the ctest case dispatch.max_isa_unknown sets it)";
  const auto compiled = rope::dispatch::compiled();
  if (contains(compiled, cap)) GTEST_SKIP() << "ROPE_DISPATCH_MAX_ISA=" << cap << " is one of the choices";
  const auto refused = [&](const char* call, void (*run)()) {
    try {
      run();
      ADD_FAILURE() << call << " did not throw under ROPE_DISPATCH_MAX_ISA=" << cap;
    } catch (const rope::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rope::dispatch: the environment variable ROPE_DISPATCH_MAX_ISA must be unset, empty or one "
                          "of the instruction sets built in ("),
                std::string::npos)
          << call << ": " << what;
      EXPECT_NE(what.find(std::string("got ") + cap), std::string::npos) << call << ": " << what;
      for (const auto& name : compiled) EXPECT_NE(what.find(name), std::string::npos) << call << ": " << what;
    }
  };
  // The first call fails, and so does every later one: nothing is chosen.
  refused("install()", [] { rope::dispatch::install(); });
  refused("install() again", [] { rope::dispatch::install(); });
  refused("arch()", [] { rope::dispatch::arch(); });
  refused("available()", [] { rope::dispatch::available(); });
  refused("force(the baseline)", [] { rope::dispatch::force(rope::dispatch::compiled().back()); });
  refused("reset()", [] { rope::dispatch::reset(); });
  EXPECT_FALSE(rope::dispatch::installed()) << "every call into the tensor API keeps its compiled-in loop";
}

// Whether the operating system saves an instruction set's registers, from
// XCR0 values a machine may report: AVX-512 needs the XMM, YMM and all three
// AVX-512 states; AVX2 the XMM and YMM states; SSE2 nothing (0 is what
// dispatch.cpp passes without OSXSAVE).
TEST(DispatchXcr0, AnInstructionSetNeedsTheOsToSaveItsRegisters) {
  using rope::dispatch::xcr0::enables;
  using Avx512 = xsimd::avx512bw;
  using Avx2 = xsimd::fma3<xsimd::avx2>;
  using Sse2 = xsimd::sse2;
  constexpr std::uint64_t kX87 = 0x1, kXmm = 0x2, kYmm = 0x4, kOpmask = 0x20, kZmmHigh = 0x40, kZmm16 = 0x80;
  constexpr std::uint64_t kFull = kX87 | kXmm | kYmm | kOpmask | kZmmHigh | kZmm16;  // 0xe7
  EXPECT_TRUE(enables<Avx512>(kFull));
  EXPECT_TRUE(enables<Avx2>(kFull));
  EXPECT_TRUE(enables<Sse2>(kFull));
  EXPECT_TRUE(enables<Avx512>(kFull | 0x60200)) << "states past AVX-512's (AMX tiles, PKRU) change nothing";
  // YMM but no ZMM state: an AVX2 machine, or AVX-512 the OS leaves off.
  EXPECT_FALSE(enables<Avx512>(kX87 | kXmm | kYmm));
  EXPECT_TRUE(enables<Avx2>(kX87 | kXmm | kYmm));
  EXPECT_TRUE(enables<Sse2>(kX87 | kXmm | kYmm));
  for (std::uint64_t missing : {kOpmask, kZmmHigh, kZmm16}) {
    EXPECT_FALSE(enables<Avx512>(kFull & ~missing)) << "without state bit " << missing;
    EXPECT_TRUE(enables<Avx2>(kFull & ~missing)) << "without state bit " << missing;
  }
  // No YMM state: only SSE2, whatever else is set.
  for (std::uint64_t xcr0 : {kX87 | kXmm, kFull & ~kYmm, std::uint64_t{0}}) {
    EXPECT_FALSE(enables<Avx512>(xcr0)) << xcr0;
    EXPECT_FALSE(enables<Avx2>(xcr0)) << xcr0;
    EXPECT_TRUE(enables<Sse2>(xcr0)) << xcr0;
  }
  // YMM without XMM: AVX needs both.
  EXPECT_FALSE(enables<Avx2>(kX87 | kYmm));
  EXPECT_FALSE(enables<Avx512>(kFull & ~kXmm));
  // No XCR0 at all on aarch64.
  EXPECT_TRUE(enables<xsimd::neon64>(0));
}

template <class T>
class DispatchTypes : public Dispatch {};
using ElementTypes = ::testing::Types<float, double, rope::BFloat16, rope::Float16>;
struct ElementTypeNames {
  template <class T>
  static std::string GetName(int) {
    if (std::is_same<T, float>::value) return "f32";
    if (std::is_same<T, double>::value) return "f64";
    return std::is_same<T, rope::BFloat16>::value ? "bf16" : "fp16";
  }
};
TYPED_TEST_SUITE(DispatchTypes, ElementTypes, ElementTypeNames);

TYPED_TEST(DispatchTypes, EveryAvailableInstructionSetMatchesItsRoundingBitForBit) {
  for (const auto& arch : rope::dispatch::available()) {
    rope::dispatch::force(arch);
    ASSERT_EQ(rope::dispatch::arch(), arch);
    rope_test::check_calls<TypeParam>(arch, fuses(arch), nullptr);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The header-only path of this translation unit is the compile-time build of
// the baseline instruction set: dispatch forced to that set must give the
// same bytes, call for call.
TYPED_TEST(DispatchTypes, BaselineForcedEqualsThisProgramsHeaderOnlyPath) {
  using T = TypeParam;
  const std::string baseline = xsimd::default_arch::name();
  if (!contains(rope::dispatch::compiled(), baseline)) {
    GTEST_SKIP() << "rope::dispatch has no table for this program's baseline, " << baseline;
  }
  rope::dispatch::uninstall();
  std::vector<std::vector<T>> header_only, dispatched;
  rope_test::check_calls<T>(baseline, fuses(baseline), &header_only);
  rope::dispatch::force(baseline);
  rope_test::check_calls<T>(baseline, fuses(baseline), &dispatched);
  ASSERT_EQ(header_only.size(), dispatched.size());
  for (std::size_t i = 0; i < header_only.size(); ++i) {
    ASSERT_TRUE(rope_test::same_bytes(header_only[i], dispatched[i])) << "call " << i;
  }
}

// Forcing while calls run. A call reads the table once, after its checks,
// and runs every chunk of its tokens with that loop, so each result is the
// bytes of one instruction set. SSE2 rounds differently from the fused
// sets: a call whose chunks ran different loops would match none of them.
// Four chunks per call, on threads of rope's own that start one after the
// other, two callers, and a third thread cycling force() over available()
// until both are done. ThreadSanitizer runs this test (the tsan stage).
class DispatchThreads : public Dispatch {};

TEST_F(DispatchThreads, ForceWhileCallsRun) {
  const std::vector<std::string> names = rope::dispatch::available();
  if (names.size() < 2) GTEST_SKIP() << "one instruction set to choose from: " << names.front();
  constexpr std::size_t kTokens = 256, kHeads = 8, kHeadDim = 128, kCalls = 16, kCallers = 2;
  const rope::Table<float> table(rope::frequencies(kHeadDim, 10000.0), kTokens);
  const auto x = rope_test::random_tensor<float>(kTokens * kHeads * kHeadDim, 3);
  const rope::Options options{0, rope::Direction::forward, 4, rope::Stores::cached, {}};
  const auto rotate = [&](std::vector<float>& out) {
    rope::apply<float, float>(rope::View<const float>::token_major(x.data(), kTokens, kHeads, kHeadDim),
                              rope::View<float>::token_major(out.data(), kTokens, kHeads, kHeadDim), table,
                              rope::Style::rotate_half, 0, options);
  };
  // The bytes of each instruction set, forced alone; those that give the
  // same bytes (the fused ones) make one kind.
  std::vector<std::vector<float>> kinds;
  std::vector<std::string> kind_names;
  for (const auto& name : names) {
    rope::dispatch::force(name);
    std::vector<float> out(x.size(), 0.0f);
    rotate(out);
    std::size_t k = 0;
    while (k < kinds.size() && !rope_test::same_bytes(out, kinds[k])) ++k;
    if (k == kinds.size()) {
      kinds.push_back(std::move(out));
      kind_names.emplace_back();
    }
    kind_names[k] += (kind_names[k].empty() ? "" : "/") + name;
  }
  ASSERT_GE(kinds.size(), 2u) << "every instruction set gives the same bytes here: a mixed call would go unseen";

  std::atomic<bool> done{false};
  std::atomic<std::size_t> cycles{0};
  std::thread forcer([&] {
    while (!done.load()) {
      for (const auto& name : names) rope::dispatch::force(name);
      cycles.fetch_add(1);
    }
  });
  while (cycles.load() == 0) std::this_thread::yield();
  // seen[c][k]: calls of caller c that gave the bytes of kinds[k]; the last
  // column, those that gave none of them.
  std::vector<std::vector<std::size_t>> seen(kCallers, std::vector<std::size_t>(kinds.size() + 1, 0));
  std::vector<std::thread> callers;
  for (std::size_t c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      std::vector<float> out(x.size(), 0.0f);
      for (std::size_t call = 0; call < kCalls; ++call) {
        rotate(out);
        std::size_t k = 0;
        while (k < kinds.size() && !rope_test::same_bytes(out, kinds[k])) ++k;
        ++seen[c][k];
      }
    });
  }
  for (auto& t : callers) t.join();
  const std::size_t forced_during = cycles.load();
  done.store(true);
  forcer.join();
  std::string counts;
  for (std::size_t k = 0; k <= kinds.size(); ++k) {
    std::size_t n = 0;
    for (const auto& per_caller : seen) n += per_caller[k];
    counts += (counts.empty() ? "" : ", ") + (k < kinds.size() ? kind_names[k] : std::string("none")) + " " +
              std::to_string(n);
  }
  std::cout << "[ results  ] " << counts << "; " << forced_during << " cycles of force\n";
  for (std::size_t c = 0; c < kCallers; ++c) {
    EXPECT_EQ(seen[c][kinds.size()], 0u) << "caller " << c << ": calls whose bytes are no instruction set's (all "
                                         << "callers: " << counts << ")";
  }
}

// One item of batched attention over a paged cache of E: 8 query heads on 2
// key/value heads, head_dim 72 (a tail for every instruction set), 150 keys
// in pages of 16 given out of order (a chunk of 64 keys and a partial one).
template <class E>
struct AttendCase {
  static constexpr std::size_t kHeads = 8, kKvHeads = 2, kDim = 72, kPage = 16, kPages = 12, kKeys = 150;
  std::vector<E> k, v;
  std::vector<float> k_scales, v_scales, q;
  std::vector<std::int32_t> pages;
  rope::KvKeys<E> keys;

  AttendCase() : k(kPages * kPage * kKvHeads * kDim), v(k.size()), q(kHeads * kDim) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const bool scaled = rope::KvElement<E>::kScaled;
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = scaled ? E(static_cast<int>(std::lround(127 * u(rng)))) : E(u(rng));
      v[i] = scaled ? E(static_cast<int>(std::lround(127 * u(rng)))) : E(u(rng));
    }
    if (scaled) {
      k_scales.assign(kPages * kPage * kKvHeads, 0.0f);
      v_scales.assign(k_scales.size(), 0.0f);
      for (auto& s : k_scales) s = 0.01f * (1.5f + u(rng));
      for (auto& s : v_scales) s = 0.01f * (1.5f + u(rng));
    }
    for (auto& x : q) x = u(rng);
    pages = {5, 2, 9, 0, 11, 7, 3, 8, 1, 10};
    keys =
        rope_test::pool_keys(k.data(), v.data(), scaled ? k_scales.data() : nullptr, scaled ? v_scales.data() : nullptr,
                             pages.data(), kPage, kHeads, kKvHeads, kDim, 3, kKeys - 3, 64, 0.125f);
  }

  double value(const std::vector<E>& x, const std::vector<float>& scales, std::size_t slot, std::size_t g,
               std::size_t c) const {
    const double s = scales.empty() ? 1.0 : scales[slot * kKvHeads + g];
    return s * rope::detail::widen_value(x[slot * kKvHeads * kDim + g * kDim + c]);
  }

  // out[h * kDim + c] = the softmax-weighted values of head h, in double.
  std::vector<double> oracle() const {
    std::vector<double> out(kHeads * kDim, 0.0);
    for (std::size_t h = 0; h < kHeads; ++h) {
      const std::size_t g = h / (kHeads / kKvHeads);
      std::vector<double> s;
      for (std::size_t j = keys.first_key; j < keys.first_key + keys.keys; ++j) {
        const std::size_t slot = static_cast<std::size_t>(pages[j / kPage]) * kPage + j % kPage;
        double dot = 0;
        for (std::size_t c = 0; c < kDim; ++c) dot += double(q[h * kDim + c]) * value(k, k_scales, slot, g, c);
        s.push_back(double(keys.scale) * dot);
      }
      const double m = *std::max_element(s.begin(), s.end());
      double l = 0;
      for (double& x : s) l += (x = std::exp(x - m));
      for (std::size_t j = 0; j < s.size(); ++j) {
        const std::size_t key = keys.first_key + j;
        const std::size_t slot = static_cast<std::size_t>(pages[key / kPage]) * kPage + key % kPage;
        for (std::size_t c = 0; c < kDim; ++c) out[h * kDim + c] += s[j] / l * value(v, v_scales, slot, g, c);
      }
    }
    return out;
  }

  // The attention rows through whichever attend_keys is given (null: this
  // program's compiled-in one).
  std::vector<float> run(rope::detail::AttendKeys<E> attend) const {
    std::vector<float> work(rope::attend_work(kHeads, kDim, kDim, keys.chunk)), m(kHeads), l(kHeads),
        acc(kHeads * kDim), out(kHeads * kDim);
    if (attend != nullptr) {
      attend(keys, q.data(), work.data(), m.data(), l.data(), acc.data());
    } else {
      rope::attend_keys<E>(keys, q.data(), work.data(), m.data(), l.data(), acc.data());
    }
    for (std::size_t h = 0; h < kHeads; ++h) {
      for (std::size_t c = 0; c < kDim; ++c) out[h * kDim + c] = acc[h * kDim + c] / l[h];
    }
    return out;
  }
};

template <class E>
class DispatchAttend : public Dispatch {};
using KvTypes = ::testing::Types<float, rope::BFloat16, rope::Float16, std::int8_t, rope::Float8E4M3, rope::Float8E5M2>;
struct KvTypeNames {
  template <class E>
  static std::string GetName(int) {
    if (std::is_same<E, float>::value) return "f32";
    if (std::is_same<E, std::int8_t>::value) return "i8";
    if (std::is_same<E, rope::Float8E4M3>::value) return "e4m3";
    if (std::is_same<E, rope::Float8E5M2>::value) return "e5m2";
    return std::is_same<E, rope::BFloat16>::value ? "bf16" : "fp16";
  }
};
TYPED_TEST_SUITE(DispatchAttend, KvTypes, KvTypeNames);

// Values of magnitude <= 1 (int8, fp8: <= 128 * 0.025), weights summing to 1:
// float rounding of scores and sums over 147 keys stays far below 1e-5.
TYPED_TEST(DispatchAttend, EveryAvailableInstructionSetAttendsWithinFloatRounding) {
  const AttendCase<TypeParam> c;
  const std::vector<double> expected = c.oracle();
  for (const auto& arch : rope::dispatch::available()) {
    rope::dispatch::force(arch);
    const auto attend = rope::detail::installed_attend<TypeParam>();
    ASSERT_NE(attend, nullptr) << arch;
    const std::vector<float> got = c.run(attend);
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], expected[i], 1e-5) << arch << " element " << i;
    }
  }
  rope::dispatch::uninstall();
  EXPECT_EQ(rope::detail::installed_attend<TypeParam>(), nullptr) << "uninstalled: the compiled-in path";
}

// attend_keys rounds each part of its work up to whole cache lines, so that
// rows start on one when work does; the bits must not depend on where work
// starts. A chunk of 63 keys makes the scores' part (8 x 63 floats) end
// inside a line; the floats around work must stay as they were.
TYPED_TEST(DispatchAttend, EveryInstructionSetGivesTheSameBitsWhereverItsWorkStarts) {
  AttendCase<TypeParam> c;
  c.keys.chunk = 63;
  const std::size_t size = rope::attend_work(c.kHeads, c.kDim, c.kDim, c.keys.chunk);
  std::vector<std::string> archs = rope::dispatch::available();
  archs.push_back("");  // this program's compiled-in path
  for (const auto& arch : archs) {
    rope::detail::AttendKeys<TypeParam> attend = nullptr;
    if (!arch.empty()) {
      rope::dispatch::force(arch);
      attend = rope::detail::installed_attend<TypeParam>();
      ASSERT_NE(attend, nullptr) << arch;
    }
    std::vector<float> first;
    for (std::size_t offset = 0; offset < 16; ++offset) {
      std::vector<float> buffer(size + offset + 32, -1.5f);
      const std::size_t skew = reinterpret_cast<std::uintptr_t>(buffer.data()) % 64 / sizeof(float);
      const std::size_t start = (16 - skew) % 16 + offset;
      float* work = buffer.data() + start;
      std::vector<float> m(c.kHeads), l(c.kHeads), acc(c.kHeads * c.kDim);
      if (attend != nullptr) {
        attend(c.keys, c.q.data(), work, m.data(), l.data(), acc.data());
      } else {
        rope::attend_keys<TypeParam>(c.keys, c.q.data(), work, m.data(), l.data(), acc.data());
      }
      for (std::size_t i = 0; i < buffer.size(); ++i) {
        if (i < start || i >= start + size) {
          ASSERT_EQ(buffer[i], -1.5f) << (arch.empty() ? "compiled-in" : arch) << ": work " << offset
                                      << " floats past a line, float " << i << " outside its work written";
        }
      }
      std::vector<float> got = acc;
      got.insert(got.end(), m.begin(), m.end());
      got.insert(got.end(), l.begin(), l.end());
      if (offset == 0) {
        first = got;
      } else {
        ASSERT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)), 0)
            << (arch.empty() ? "compiled-in" : arch) << ": work " << offset << " floats past a line";
      }
    }
  }
  rope::dispatch::uninstall();
}

TYPED_TEST(DispatchAttend, BaselineForcedEqualsThisProgramsHeaderOnlyPath) {
  const std::string baseline = xsimd::default_arch::name();
  if (!contains(rope::dispatch::compiled(), baseline)) {
    GTEST_SKIP() << "rope::dispatch has no table for this program's baseline, " << baseline;
  }
  const AttendCase<TypeParam> c;
  const std::vector<float> header_only = c.run(nullptr);
  rope::dispatch::force(baseline);
  const std::vector<float> dispatched = c.run(rope::detail::installed_attend<TypeParam>());
  EXPECT_TRUE(rope_test::same_bytes(header_only, dispatched));
}

}  // namespace
