// A case timed against its baseline in the same iterations, for the ratios
// the targets are read from (a kernel against memcpy of its bytes, a decode
// step against a read of its cache, a dispatched call against the native
// build's).
//
// Timed apart, two cases of one run meet the shared machine at different
// moments: on a 2-vCPU VM the same case moved by 10-20% between its
// repetitions (the load of other tenants on memory bandwidth and the clock),
// so the ratio of two medians moved more than the effects it was meant to
// show. Paired, each iteration runs the baseline and then the case, each
// timed alone; the case's time is its own (UseManualTime) and the counter
// `name` holds the baseline's time summed over the iterations over the
// case's: the case's speed in units of the baseline, both taken at the
// same moments. With `calls` > 1 each timed stretch runs the baseline and
// then the case that many times (a decode step of a few hundred ns would
// otherwise be mostly the clock), and the case reports the time of one call.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

namespace rope_bench {

// A baseline the case is timed against: `stretch` runs it once per call of
// a stretch (`calls` times), `enter` before each stretch, outside the
// timing (a dispatched case switches rope::dispatch off for its native
// baseline). Its counter is named `name`.
struct BaselineCall {
  const char* name;
  std::function<void()> stretch;
  std::function<void()> enter = [] {};
};

// Each iteration runs every baseline's stretch, then `calls` calls of the
// case (enter_case() first, outside the timing); a counter per baseline.
// Each stretch counts as `calls` iterations, its time as theirs: the
// case's time per iteration is the time of one call.
template <class Case, class EnterCase>
void paired(benchmark::State& state, std::size_t calls, const std::vector<BaselineCall>& baselines, Case&& run,
            EnterCase&& enter_case) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> baseline_seconds(baselines.size(), 0.0);
  double case_seconds = 0.0;
  while (state.KeepRunningBatch(static_cast<benchmark::IterationCount>(calls))) {
    for (std::size_t b = 0; b < baselines.size(); ++b) {
      baselines[b].enter();
      const auto t0 = Clock::now();
      baselines[b].stretch();
      baseline_seconds[b] += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    enter_case();
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < calls; ++i) run();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    case_seconds += seconds;
    state.SetIterationTime(seconds);
  }
  for (std::size_t b = 0; b < baselines.size(); ++b) {
    state.counters[baselines[b].name] = case_seconds > 0.0 ? baseline_seconds[b] / case_seconds : 0.0;
  }
}

// One baseline, `calls` calls a stretch; its loop is compiled in place, so
// a call of a few hundred ns is timed without an indirect call per call.
template <class Baseline, class Case, class EnterBaseline, class EnterCase>
void paired(benchmark::State& state, const char* name, std::size_t calls, Baseline&& baseline, Case&& run,
            EnterBaseline&& enter_baseline, EnterCase&& enter_case) {
  paired(state, calls,
         {{name,
           [&] {
             for (std::size_t i = 0; i < calls; ++i) baseline();
           },
           enter_baseline}},
         run, enter_case);
}

template <class Baseline, class Case>
void paired(benchmark::State& state, const char* name, std::size_t calls, Baseline&& baseline, Case&& run) {
  paired(
      state, name, calls, baseline, run, [] {}, [] {});
}

}  // namespace rope_bench
