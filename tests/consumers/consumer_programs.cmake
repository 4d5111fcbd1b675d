# The consumer programs, one per part of rope each links: every consumer
# project (find_package, add_subdirectory, FetchContent) builds those of the
# parts whose targets it has.
add_executable(rope_consumer ${CMAKE_CURRENT_LIST_DIR}/consumer.cpp)
target_link_libraries(rope_consumer PRIVATE rope::rope)
foreach(_part attention hf_config dispatch)
  if(TARGET rope::${_part})
    add_executable(rope_consumer_${_part} ${CMAKE_CURRENT_LIST_DIR}/consumer_${_part}.cpp)
    target_link_libraries(rope_consumer_${_part} PRIVATE rope::${_part})
  endif()
endforeach()
