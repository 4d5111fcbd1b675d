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

// enter_baseline() and enter_case() run before each timed stretch, outside
// it (a dispatched case switches rope::dispatch off for its native baseline).
template <class Baseline, class Case, class EnterBaseline, class EnterCase>
void paired(benchmark::State& state, const char* name, std::size_t calls, Baseline&& baseline, Case&& run,
            EnterBaseline&& enter_baseline, EnterCase&& enter_case) {
  using Clock = std::chrono::steady_clock;
  double baseline_seconds = 0.0, case_seconds = 0.0;
  // Each stretch counts as `calls` iterations, its time as theirs: the
  // case's time per iteration is the time of one call.
  while (state.KeepRunningBatch(static_cast<benchmark::IterationCount>(calls))) {
    enter_baseline();
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < calls; ++i) baseline();
    const auto t1 = Clock::now();
    enter_case();
    const auto t2 = Clock::now();
    for (std::size_t i = 0; i < calls; ++i) run();
    const auto t3 = Clock::now();
    const double seconds = std::chrono::duration<double>(t3 - t2).count();
    baseline_seconds += std::chrono::duration<double>(t1 - t0).count();
    case_seconds += seconds;
    state.SetIterationTime(seconds);
  }
  state.counters[name] = case_seconds > 0.0 ? baseline_seconds / case_seconds : 0.0;
}

// A case timed against several baselines, each in every iteration before
// the case, one call each: a counter per baseline (its name), as paired's.
struct BaselineCall {
  const char* name;
  std::function<void()> run;
};
template <class Case>
void paired(benchmark::State& state, const std::vector<BaselineCall>& baselines, Case&& run) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> baseline_seconds(baselines.size(), 0.0);
  double case_seconds = 0.0;
  for (auto _ : state) {
    std::size_t i = 0;
    for (const BaselineCall& b : baselines) {
      const auto t0 = Clock::now();
      b.run();
      baseline_seconds[i++] += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    const auto t0 = Clock::now();
    run();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    case_seconds += seconds;
    state.SetIterationTime(seconds);
  }
  std::size_t i = 0;
  for (const BaselineCall& b : baselines) {
    state.counters[b.name] = case_seconds > 0.0 ? baseline_seconds[i++] / case_seconds : 0.0;
  }
}

template <class Baseline, class Case>
void paired(benchmark::State& state, const char* name, std::size_t calls, Baseline&& baseline, Case&& run) {
  paired(
      state, name, calls, baseline, run, [] {}, [] {});
}

}  // namespace rope_bench
