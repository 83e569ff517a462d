# Installs the build tree into a scratch prefix, then checks what an embedder gets from it:
#  - the consumer project: `find_package(kvtier)` with `kvtier::kvtier` (C++) and
#    `kvtier::kvtier_c` (C) builds and runs, and leaves the consumer's own variables alone;
#  - pkg-config: `pkg-config --cflags --libs kvtier` compiles and links a C program that runs;
#  - the installed libkvtier.so: SONAME libkvtier.so.MAJOR, only the kvt_* symbols, no empty
#    RUNPATH entry (tests/runtime/c_api_symbols.cmake);
#  - `find_package(kvtier QUIET)` with a dependency missing: not found, and no fatal error.
# Invoked by ctest: cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DCC=... -DPKG_CONFIG=...
#                   -DNM=... -DREADELF=... -DVERSION=... -DSOVERSION=... [-DSANITIZE_FLAGS=...]
#                   -P run_install_test.cmake
# SANITIZE_FLAGS: the sanitizer flags kvtier was built with (sanitizer presets), given to the
# consumers too, whose programs must load the sanitizer's runtime first.
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR CC PKG_CONFIG NM READELF VERSION SOVERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "${var} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

# Runs a command that must succeed; its stdout lands in `step_output`.
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

function(expect_output pattern what)
  if(NOT step_output MATCHES "${pattern}")
    message(FATAL_ERROR "${what}: the output does not match '${pattern}':\n${step_output}")
  endif()
endfunction()

run_step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# CMake consumer, C++ and C.
separate_arguments(sanitize UNIX_COMMAND "${SANITIZE_FLAGS}")
run_step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/consumer
         -G Ninja -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
         "-DCMAKE_C_FLAGS=${SANITIZE_FLAGS}" "-DCMAKE_CXX_FLAGS=${SANITIZE_FLAGS}"
         "-DCMAKE_EXE_LINKER_FLAGS=${SANITIZE_FLAGS}")
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run_step(${WORK_DIR}/consumer/consumer)
expect_output("kvtier [0-9.]+: 4 block keys" "the C++ consumer")
run_step(${WORK_DIR}/consumer/c_consumer)
expect_output("kvtier ${VERSION} \\(C\\): 4 block keys" "the C consumer (CMake)")

# pkg-config consumer: the installed kvtier.pc, relocated with the prefix.
set(ENV{PKG_CONFIG_PATH} "")
file(GLOB_RECURSE pc_files ${prefix}/*/kvtier.pc)
list(LENGTH pc_files n_pc)
if(NOT n_pc EQUAL 1)
  message(FATAL_ERROR "expected one kvtier.pc under ${prefix}, found: ${pc_files}")
endif()
get_filename_component(pc_dir ${pc_files} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
run_step(${PKG_CONFIG} --modversion kvtier)
expect_output("^${VERSION}\n$" "pkg-config --modversion kvtier")
run_step(${PKG_CONFIG} --variable=libdir kvtier)
string(STRIP "${step_output}" pc_libdir)
run_step(${PKG_CONFIG} --cflags --libs kvtier)
expect_output("-lkvtier" "pkg-config --libs kvtier")
separate_arguments(pc_flags UNIX_COMMAND "${step_output}")
run_step(${CC} -std=c11 -Wall -Wextra -Wpedantic -Werror
         ${SOURCE_DIR}/tests/install/consumer/c_consumer.c ${pc_flags} ${sanitize}
         -o ${WORK_DIR}/c_consumer_pc)
run_step(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${pc_libdir} ${WORK_DIR}/c_consumer_pc)
expect_output("kvtier ${VERSION} \\(C\\): 4 block keys" "the C consumer (pkg-config)")

# The installed library itself.
get_filename_component(library "${pc_libdir}/libkvtier.so" REALPATH)
if(NOT EXISTS "${pc_libdir}/libkvtier.so.${SOVERSION}")
  message(FATAL_ERROR "no ${pc_libdir}/libkvtier.so.${SOVERSION} (the SONAME link) was installed")
endif()
run_step(${CMAKE_COMMAND} -DNM=${NM} -DREADELF=${READELF} -DLIBRARY=${library}
         -DSONAME=libkvtier.so.${SOVERSION} -DHEADER=${prefix}/include/kvtier/kvtier.h
         -DMAP=${SOURCE_DIR}/runtime/kvtier.map -P ${SOURCE_DIR}/tests/runtime/c_api_symbols.cmake)

# find_package(kvtier QUIET) with every pkg-config module hidden: not found, not fatal.
file(MAKE_DIRECTORY ${WORK_DIR}/no-pkgconfig)
run_step(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR=${WORK_DIR}/no-pkgconfig
         ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/quiet -B ${WORK_DIR}/quiet -G Ninja
         -DCMAKE_PREFIX_PATH=${prefix})
expect_output("kvtier not found, as expected: kvtier needs liburing" "find_package(kvtier QUIET)")

message(STATUS "install test: all checks passed")
