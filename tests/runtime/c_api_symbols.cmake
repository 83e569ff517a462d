# libkvtier.so exports exactly the C ABI: every defined dynamic symbol is a kvt_* function that
# include/kvtier/kvtier.h declares and runtime/kvtier.map lists, and every such function is
# exported, under the map's version node. Nothing of the C++ inside (kvtier::, std::, yaml-cpp,
# Boost) leaks out. Its SONAME is libkvtier.so.MAJOR (the ABI grows through version nodes) and its
# RUNPATH has no empty entry (which the loader takes as the current directory).
# Invoked by ctest: cmake -DNM=... -DREADELF=... -DLIBRARY=... -DSONAME=... -DHEADER=... -DMAP=...
#                   -P c_api_symbols.cmake
cmake_policy(VERSION 3.25)
foreach(var NM READELF LIBRARY SONAME HEADER MAP)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "${var} is not set")
  endif()
endforeach()

execute_process(COMMAND ${READELF} -d ${LIBRARY}
                RESULT_VARIABLE rc OUTPUT_VARIABLE dynamic ERROR_VARIABLE readelf_err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${LIBRARY} failed (${rc}): ${readelf_err}")
endif()
if(NOT dynamic MATCHES "\\(SONAME\\)[^\n]*\\[([^]\n]*)\\]")
  message(FATAL_ERROR "${LIBRARY} has no SONAME:\n${dynamic}")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL "${SONAME}")
  message(FATAL_ERROR "${LIBRARY} has SONAME ${CMAKE_MATCH_1}, expected ${SONAME}")
endif()
string(REGEX MATCHALL "\\((RPATH|RUNPATH)\\)[^\n]*\\[[^]\n]*\\]" search_paths "${dynamic}")
foreach(entry IN LISTS search_paths)
  string(REGEX MATCH "\\[([^]\n]*)\\]" _ "${entry}")
  set(path_list "${CMAKE_MATCH_1}")
  if(path_list STREQUAL "" OR path_list MATCHES "^:|::|:$")
    message(FATAL_ERROR "${LIBRARY}: an empty entry (the current directory) in ${entry}")
  endif()
endforeach()

execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
                RESULT_VARIABLE rc OUTPUT_VARIABLE nm_out ERROR_VARIABLE nm_err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D ${LIBRARY} failed (${rc}): ${nm_err}")
endif()

set(exported "")
set(versions "")
set(leaked "")
string(REPLACE "\n" ";" nm_lines "${nm_out}")
foreach(line IN LISTS nm_lines)
  if(line MATCHES "^[0-9a-fA-F]* *([A-Za-z]) ([^@ ]+)(@@?([^ ]+))?$")
    set(type ${CMAKE_MATCH_1})
    set(name ${CMAKE_MATCH_2})
    set(node ${CMAKE_MATCH_4})
    if(type STREQUAL "A")  # a version node's own definition
      list(APPEND versions ${name})
    elseif(name MATCHES "^kvt_")
      list(APPEND exported ${name})
      if(NOT node STREQUAL "KVTIER_0.1")
        list(APPEND leaked "${name} (version '${node}', expected KVTIER_0.1)")
      endif()
    else()
      list(APPEND leaked ${name})
    endif()
  endif()
endforeach()
if(leaked)
  list(JOIN leaked "\n  " text)
  message(FATAL_ERROR "libkvtier.so exports symbols outside the C ABI:\n  ${text}")
endif()

file(READ ${HEADER} header_text)
string(REGEX MATCHALL "KVT_API [^;(]*[ *](kvt_[a-z0-9_]+)\\(" decls "${header_text}")
set(declared "")
foreach(d IN LISTS decls)
  string(REGEX MATCH "(kvt_[a-z0-9_]+)\\($" _ "${d}")
  list(APPEND declared ${CMAKE_MATCH_1})
endforeach()

file(READ ${MAP} map_text)
string(REGEX MATCHALL "kvt_[a-z0-9_]+" listed "${map_text}")

foreach(list_name exported declared listed)
  list(REMOVE_DUPLICATES ${list_name})
  list(SORT ${list_name})
endforeach()
list(LENGTH declared n_declared)
if(n_declared LESS 30)
  message(FATAL_ERROR "found only ${n_declared} declarations in ${HEADER}: the pattern is stale")
endif()
if(NOT exported STREQUAL declared OR NOT listed STREQUAL declared)
  message(FATAL_ERROR "the C ABI disagrees with itself:\n"
                      "  declared in kvtier.h: ${declared}\n"
                      "  listed in kvtier.map: ${listed}\n"
                      "  exported by the .so:  ${exported}")
endif()
if(NOT "KVTIER_0.1" IN_LIST versions)
  message(FATAL_ERROR "libkvtier.so defines no KVTIER_0.1 version node (found: ${versions})")
endif()
message(STATUS "libkvtier.so exports exactly the ${n_declared} kvt_* functions of kvtier.h")
