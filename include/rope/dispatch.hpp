// rope/dispatch.hpp — runtime dispatch: the tensor API's token loop compiled
// once per instruction set, the best one picked from what the CPU reports.
//
// Header-only rope runs the SIMD instruction set your compiler flags enable:
// SSE2 on x86-64 unless you build with -mavx2, -march=native or similar. The
// compiled library rope::dispatch (CMake: ROPE_DISPATCH=ON, link
// rope::dispatch) carries the token loop of rope::apply, apply_qk,
// apply_mrope and apply_axial built for each instruction set it knows
// (x86-64: SSE2, AVX2 with FMA, AVX-512; aarch64: NEON). After install(),
// those calls run the loop of the best instruction set the CPU runs, while
// the rest of the program keeps baseline flags. Batched attention over a KV
// cache (rope::attention::softmax_batch, softmax_batch_step) runs its keys
// (attend_keys: dot products, softmax, weighted values) through the same
// table; the rest of the attention module runs with the caller's flags. Nothing else changes: the
// same checks, the same results as a build for that instruction set.
//
//   rope::dispatch::install();          // once, e.g. at the start of main
//   rope::apply_qk(q, k, table, ...);   // runs AVX2 or AVX-512 where the CPU has it
//
// Element types: float, double, rope::BFloat16, rope::Float16. Other 2-byte
// storage types (Eigen::bfloat16, ...) keep the loop compiled in the caller.
// Instruction sets are named as xsimd names them: "sse2", "fma3+avx2",
// "avx512bw", "arm64+neon". All functions are thread-safe; a call of
// rope::apply that is running when the choice changes finishes with the loop
// it started with.
//
// The environment variable ROPE_DISPATCH_MAX_ISA, one of compiled()'s names,
// caps the choice: the instruction sets above it count as not run by this
// CPU (to compare speeds, or to keep off one a CPU runs badly). It is read
// once, by the first call that checks the CPU (install, arch, available,
// force, reset); any other non-empty value makes those calls throw
// rope::invalid_argument naming the variable, the value and the choices.
#pragma once

#include <string>
#include <vector>

namespace rope::dispatch {

// Routes the tensor API through the chosen instruction set (see arch()) and
// returns its name. Idempotent.
const char* install();

// Back to header-only behaviour: every call runs the loop compiled in its
// caller's translation unit.
void uninstall() noexcept;

// Whether install() (or force()) is in effect.
bool installed() noexcept;

// The instruction set install() uses: the one force() named, otherwise the
// best one this CPU runs, picked at the first call into rope::dispatch.
const char* arch();

// The instruction sets built into the library, best first.
std::vector<std::string> compiled();

// Those of compiled() this CPU runs (the operating system included: it must
// save the wider registers) and ROPE_DISPATCH_MAX_ISA allows, best first.
std::vector<std::string> available();

// Pins the instruction set, e.g. for tests or to compare speeds, and
// installs it. name must be one of available(); anything else throws
// rope::invalid_argument naming the choices (a name built in that the CPU
// does not run, or that is above ROPE_DISPATCH_MAX_ISA, says so) and
// changes nothing.
void force(const std::string& name);

// Forgets force(): back to the best available instruction set, installed.
void reset();

}  // namespace rope::dispatch
