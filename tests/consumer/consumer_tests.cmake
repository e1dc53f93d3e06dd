# Packaging tests, included at the end of tests/CMakeLists.txt. They use kvstore as a consumer
# would: an installed copy through find_package, the source tree through add_subdirectory, and
# (when Conan is installed) the Conan recipe through `conan create` with its test_package.
set(_kvstore_consumer_args
  -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
  -DBINARY_DIR=${PROJECT_BINARY_DIR}
  -DGENERATOR=${CMAKE_GENERATOR}
  -DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}
  -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
  -DCXX_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
  -DBUILD_TYPE=${CMAKE_BUILD_TYPE})

foreach(mode IN ITEMS find_package add_subdirectory)
  add_test(NAME consumer_${mode}
    COMMAND ${CMAKE_COMMAND} -DMODE=${mode} ${_kvstore_consumer_args}
            -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer/${mode}
            -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
  set_tests_properties(consumer_${mode} PROPERTIES TIMEOUT 600 LABELS packaging)
endforeach()

find_program(KVSTORE_CONAN conan)
if(KVSTORE_CONAN)
  # A throwaway Conan home in the build tree: the test does not read or change ~/.conan2.
  add_test(NAME conan_create
    COMMAND ${CMAKE_COMMAND} -E env
            CONAN_HOME=${CMAKE_CURRENT_BINARY_DIR}/conan/home
            KVSTORE_CONAN_WORK=${CMAKE_CURRENT_BINARY_DIR}/conan/work
            bash ${PROJECT_SOURCE_DIR}/scripts/conan-create.sh)
  set_tests_properties(conan_create PROPERTIES TIMEOUT 900 LABELS packaging)
  # The same recipe with the compiled library (header_only=False), in a Conan home of its own so
  # the two runs can go side by side.
  add_test(NAME conan_create_compiled
    COMMAND ${CMAKE_COMMAND} -E env
            CONAN_HOME=${CMAKE_CURRENT_BINARY_DIR}/conan-compiled/home
            KVSTORE_CONAN_WORK=${CMAKE_CURRENT_BINARY_DIR}/conan-compiled/work
            bash ${PROJECT_SOURCE_DIR}/scripts/conan-create.sh -o "kvstore/*:header_only=False")
  set_tests_properties(conan_create_compiled PROPERTIES TIMEOUT 900 LABELS packaging)
endif()
