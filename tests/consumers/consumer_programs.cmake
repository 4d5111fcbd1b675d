# The consumer programs, one per part of rope each links: every consumer
# project (find_package, add_subdirectory, FetchContent) builds the core's
# and those of the parts whose targets it has, among the parts
# rope_consumer_parts names (all three unless the project sets it).
add_executable(rope_consumer ${CMAKE_CURRENT_LIST_DIR}/consumer.cpp)
target_link_libraries(rope_consumer PRIVATE rope::rope)
if(NOT DEFINED rope_consumer_parts)
  set(rope_consumer_parts attention hf_config dispatch)
endif()
foreach(_part IN LISTS rope_consumer_parts)
  if(TARGET rope::${_part})
    add_executable(rope_consumer_${_part} ${CMAKE_CURRENT_LIST_DIR}/consumer_${_part}.cpp)
    target_link_libraries(rope_consumer_${_part} PRIVATE rope::${_part})
  endif()
endforeach()
