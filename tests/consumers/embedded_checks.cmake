# What embedding rope (add_subdirectory, FetchContent) must and must not give
# a project: the library's targets, and none of rope's tests, bench, fuzz
# target or examples (they would lengthen every build of the project).
foreach(_target rope::rope rope::native rope::attention)
  if(NOT TARGET ${_target})
    message(FATAL_ERROR "embedding rope did not define ${_target}")
  endif()
endforeach()
foreach(_target test_apply test_kernels rope_bench rope_fuzz rope_fuzz_replay rope_example_quickstart)
  if(TARGET ${_target})
    message(FATAL_ERROR "embedding rope built its own target ${_target}")
  endif()
endforeach()
