# cmake -P script behind the consumer_* ctest tests: builds and runs tests/consumer/<MODE>
# against kvstore the way a user would, with the generator and compiler of the calling build.
#   MODE          find_package (cmake --install BINARY_DIR into WORK_DIR/prefix first)
#                 | add_subdirectory (uses SOURCE_DIR directly)
#   SOURCE_DIR    kvstore's source tree          BINARY_DIR  kvstore's build tree
#   WORK_DIR      scratch folder, emptied first
#   GENERATOR, MAKE_PROGRAM, CXX_COMPILER, CXX_LAUNCHER, BUILD_TYPE: from the calling build
foreach(var IN ITEMS MODE SOURCE_DIR BINARY_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

function(step)
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer_${MODE}: step failed (${rc})")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
if(MAKE_PROGRAM)
  list(APPEND args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_LAUNCHER)
  list(APPEND args "-DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER}")
endif()
if(BUILD_TYPE)
  list(APPEND args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()

if(MODE STREQUAL "find_package")
  set(prefix "${WORK_DIR}/prefix")
  step("${CMAKE_COMMAND}" --install "${BINARY_DIR}" --prefix "${prefix}")
  list(APPEND args "-DCMAKE_PREFIX_PATH=${prefix}" "-DKVSTORE_EXPECTED_PREFIX=${prefix}"
       -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND args "-DKVSTORE_SOURCE_DIR=${SOURCE_DIR}")
else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()

step("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer/${MODE}" -B "${WORK_DIR}/build" ${args})
step("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
step("${WORK_DIR}/build/consumer")
step("${WORK_DIR}/build/consumer_compiled")
