# Debian's xsimd 8.1 exports a link dependency on a target named `xtl` but its
# config never looks for it, so linking `xsimd` fails with "cannot find -lxtl".
# xsimd needs nothing from xtl at link time: when xsimd asks for it and no xtl
# package provides it, stand in an empty interface target. Installed next to
# ropeConfig.cmake so consumers of rope get the same fix.
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_rope_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
  if(_rope_xsimd_links AND "xtl" IN_LIST _rope_xsimd_links)
    find_package(xtl QUIET CONFIG)
    if(NOT TARGET xtl)
      add_library(xtl INTERFACE IMPORTED)
    endif()
  endif()
  unset(_rope_xsimd_links)
endif()
