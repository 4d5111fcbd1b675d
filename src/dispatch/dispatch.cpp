// rope::dispatch: choosing and installing a token-loop table (isa.hpp).
// Compiled with the library's baseline flags: nothing here may use an
// instruction the CPU has not been checked for.
#include <rope/dispatch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include <rope/attention/dispatch_slots.hpp>
#include <rope/detail/fail.hpp>
#include <rope/detail/simd.hpp>
#include <rope/tensor/dispatch_table.hpp>

#include "isa.hpp"
#include "xcr0.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace rope::dispatch {
namespace {

#if defined(__x86_64__)
// XCR0: which register states the operating system saves on a context
// switch (xcr0.hpp says what each instruction set needs); 0 without OSXSAVE.
std::uint64_t os_saved_state() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 27)) == 0) return 0;  // no OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

template <class Arch>
bool os_enables() noexcept {
  return xcr0::enables<Arch>(os_saved_state());
}
#else
template <class Arch>
bool os_enables() noexcept {
  return true;
}
#endif

template <class Arch>
bool cpu_runs() noexcept {
  return detail::cpu_supports<Arch>() && os_enables<Arch>();
}

struct Target {
  const detail::DispatchTable* loops;
  const detail::AttentionTable* attention;
  bool (*runs)() noexcept;
};

// Best first: the first one the CPU runs is the default.
const Target kTargets[] = {
#if ROPE_DISPATCH_HAS_AVX512
    {&isa::avx512, &isa::avx512_attention, cpu_runs<xsimd::avx512bw>},
#endif
#if ROPE_DISPATCH_HAS_AVX2
    {&isa::avx2, &isa::avx2_attention, cpu_runs<xsimd::fma3<xsimd::avx2>>},
#endif
#if ROPE_DISPATCH_HAS_SSE2
    {&isa::sse2, &isa::sse2_attention, cpu_runs<xsimd::sse2>},
#endif
#if ROPE_DISPATCH_HAS_NEON
    {&isa::neon, &isa::neon_attention, cpu_runs<xsimd::neon64>},
#endif
};

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// ROPE_DISPATCH_MAX_ISA caps the choice: the instruction sets above the one
// it names (best first, as compiled() lists them) count as not run by this
// CPU, to compare speeds or to keep off one that a CPU runs badly. Unset or
// empty: no cap. Read once, by the first call that checks the CPU; a value
// that is none of compiled() fails that call and every later one.
constexpr const char* kMaxIsa = "ROPE_DISPATCH_MAX_ISA";

// The index in kTargets of the best instruction set the cap allows.
std::size_t first_allowed() {
  static const std::size_t first = [] {
    const char* value = std::getenv(kMaxIsa);
    if (value == nullptr || *value == '\0') return std::size_t{0};
    for (std::size_t i = 0; i < std::size(kTargets); ++i) {
      if (std::string(value) == kTargets[i].loops->arch) return i;
    }
    detail::fail("rope::dispatch", {"the environment variable ", kMaxIsa},
                 "unset, empty or one of the instruction sets built in (" + joined(compiled()) + ")",
                 std::string(value));
  }();
  return first;
}

bool capped(const Target& t) { return static_cast<std::size_t>(&t - kTargets) < first_allowed(); }

// Whether t may be chosen: the cap allows it and the CPU runs it.
bool runs(const Target& t) { return !capped(t) && t.runs(); }

// The best table the CPU runs, looked for once.
const Target& best() {
  static const Target* const chosen = [] {
    for (const Target& t : kTargets) {
      if (runs(t)) return &t;
    }
    return static_cast<const Target*>(nullptr);
  }();
  if (chosen == nullptr) {
    // Only a build whose every table needs more than the CPU has (x86-64
    // and aarch64 always have their baseline table).
    detail::fail<std::runtime_error>("rope::dispatch", "this CPU",
                                     "able to run one of the instruction sets built in (" + joined(compiled()) + ")",
                                     "none of them");
  }
  return *chosen;
}

// What install() uses; null until the first call that needs it.
std::atomic<const Target*> selected{nullptr};

const Target& current() {
  const Target* t = selected.load(std::memory_order_acquire);
  if (t != nullptr) return *t;
  const Target* expected = nullptr;
  t = &best();
  return selected.compare_exchange_strong(expected, t, std::memory_order_acq_rel) ? *t : *expected;
}

// Both tables of t in place: the tensor API's loops, attention's decode loop.
void put(const Target* t) noexcept {
  detail::installed_table.store(t != nullptr ? t->loops : nullptr, std::memory_order_release);
  detail::installed_attention.store(t != nullptr ? t->attention : nullptr, std::memory_order_release);
}

void select(const Target& t) {
  selected.store(&t, std::memory_order_release);
  put(&t);
}

}  // namespace

const char* install() {
  const Target& t = current();
  put(&t);
  return t.loops->arch;
}

void uninstall() noexcept { put(nullptr); }

bool installed() noexcept { return detail::installed_table.load(std::memory_order_acquire) != nullptr; }

const char* arch() { return current().loops->arch; }

std::vector<std::string> compiled() {
  std::vector<std::string> names;
  for (const Target& t : kTargets) names.emplace_back(t.loops->arch);
  return names;
}

std::vector<std::string> available() {
  std::vector<std::string> names;
  for (const Target& t : kTargets) {
    if (runs(t)) names.emplace_back(t.loops->arch);
  }
  return names;
}

void force(const std::string& name) {
  for (const Target& t : kTargets) {
    if (name != t.loops->arch) continue;
    if (!runs(t)) {
      const std::string cap =
          capped(t) ? std::string(": above ") + kMaxIsa + "=" + kTargets[first_allowed()].loops->arch : "";
      detail::fail("rope::dispatch::force", "name", "an instruction set this CPU runs (" + joined(available()) + ")",
                   name + " (built in, but this CPU does not run it" + cap + ")");
    }
    select(t);
    return;
  }
  detail::fail("rope::dispatch::force", "name", "one of the instruction sets built in (" + joined(compiled()) + ")",
               name);
}

void reset() { select(best()); }

}  // namespace rope::dispatch
