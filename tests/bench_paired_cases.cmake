# CTest bench.paired_cases (bench/CMakeLists.txt): two paired cases of
# rope_bench (bench/paired.hpp) run for a moment. Passes only when the
# program exits 0 and each case reports its ratio to memcpy on its own line
# of the console report, so a case that no longer reports its ratio, whose
# stretches no longer end, or after which the program fails, fails here
# rather than in a full bench run. It judges no figure.
#   cmake -DBENCH=<path of rope_bench> -P tests/bench_paired_cases.cmake
if(NOT BENCH)
  message(FATAL_ERROR "bench_paired_cases.cmake: set BENCH to the rope_bench program")
endif()
set(cases "kernel/rotate_half/simd/l2_small" "apply/f32/in_place/t1/llama3_8b_decode")
list(JOIN cases "|^" filter)
execute_process(COMMAND "${BENCH}" "--benchmark_filter=^${filter}" --benchmark_min_time=0.01
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "rope_bench exited with ${rc}, not 0")
endif()
foreach(case IN LISTS cases)
  if(NOT out MATCHES "(^|\n)${case}[^\n]* vs_memcpy=[0-9]")
    message(FATAL_ERROR "case ${case} reported no vs_memcpy ratio")
  endif()
endforeach()
