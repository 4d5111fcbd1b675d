# Checks rope::dispatch's objects (src/dispatch/isa.hpp): every symbol with
# external linkage that the AVX2 or AVX-512 object defines must name that
# object's instruction set (xsimd::fma3<xsimd::avx2>, xsimd::avx512...), apart
# from the object's own table. Such a function can only be reached from code
# for that instruction set; any other would be an inline function the linker
# might keep from this object for every caller, baseline code included.
#
#   cmake -DNM=<nm> -DOBJECTS="a.o|b.o|..." -P dispatch_symbols.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
set(checked 0)
set(failures "")
foreach(object IN LISTS objects)
  get_filename_component(file "${object}" NAME)
  if(file MATCHES "^loops_avx2\\.")
    set(isa avx2)
    set(own "xsimd::fma3<xsimd::avx2>")
  elseif(file MATCHES "^loops_avx512\\.")
    set(isa avx512)
    set(own "xsimd::avx512")
  else()
    continue()
  endif()
  execute_process(COMMAND "${NM}" -C --defined-only "${object}"
    OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}: ${errors}")
  endif()
  math(EXPR checked "${checked} + 1")
  string(REPLACE ";" "\\;" listing "${listing}")
  string(REPLACE "\n" ";" lines "${listing}")
  set(count 0)
  foreach(line IN LISTS lines)
    # "<address> <type> <name>": upper-case types and u, v, w are external.
    if(NOT line MATCHES "^[0-9a-fA-F]* ([A-Za-z]) (.*)$")
      continue()
    endif()
    set(type "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    if(NOT type MATCHES "^[A-Zuvw]$" OR type STREQUAL "U")
      continue()
    endif()
    # Only code can be a wrong instruction set's: data (type information a
    # sanitizer emits for function types, constants) runs nowhere.
    if(NOT type MATCHES "^[TWw]$")
      continue()
    endif()
    math(EXPR count "${count} + 1")
    string(FIND "${name}" "${own}" at)
    if(at GREATER -1 OR name STREQUAL "rope::dispatch::isa::${isa}"
       OR name STREQUAL "DW.ref.__gxx_personality_v0")  # data: the unwinder's pointer to its routine
      continue()
    endif()
    string(APPEND failures "\n  ${file}: ${type} ${name}")
  endforeach()
  message(STATUS "${file}: ${count} external symbols checked")
endforeach()
if(checked LESS 2)
  message(FATAL_ERROR "expected the AVX2 and AVX-512 objects among: ${OBJECTS}")
endif()
if(failures)
  message(FATAL_ERROR "symbols another instruction set's code could be linked to:${failures}")
endif()
