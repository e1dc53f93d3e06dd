# The device store's build: KVSTORE_BUILD_DEVICE (default ON when Thrust and OpenMP are found)
# defines kvstore::device_omp, the headers with Thrust's OMP backend (virtual devices over host
# memory, any C++20 compiler); KVSTORE_BUILD_DEVICE_CUDA (default ON when nvcc is found) enables
# CUDA for the CUDA builds of the device tests and benchmarks (kvstore_cuda_target()).
#
# Thrust comes from the CUDA Toolkit's CCCL (<cuda>/include/cccl) or Debian's libthrust-dev
# (/usr/include/thrust); both work.

find_path(KVSTORE_THRUST_INCLUDE_DIR thrust/version.h
  HINTS ${CUDAToolkit_ROOT}/include/cccl $ENV{CUDA_HOME}/include/cccl /usr/local/cuda/include/cccl
  PATHS /usr/include)
find_package(OpenMP COMPONENTS CXX QUIET)

set(_kvstore_device_default OFF)
if(KVSTORE_THRUST_INCLUDE_DIR AND OpenMP_CXX_FOUND)
  set(_kvstore_device_default ON)
endif()
option(KVSTORE_BUILD_DEVICE "Build the device store's tests and benchmarks (Thrust OMP backend)" ${_kvstore_device_default})

if(KVSTORE_BUILD_DEVICE)
  if(NOT KVSTORE_THRUST_INCLUDE_DIR OR NOT OpenMP_CXX_FOUND)
    message(FATAL_ERROR "KVSTORE_BUILD_DEVICE needs Thrust (CUDA Toolkit or libthrust-dev) and OpenMP")
  endif()
  message(STATUS "kvstore: device store with Thrust from ${KVSTORE_THRUST_INCLUDE_DIR}")
  add_library(kvstore_device_omp INTERFACE)
  add_library(kvstore::device_omp ALIAS kvstore_device_omp)
  target_link_libraries(kvstore_device_omp INTERFACE kvstore::kvstore OpenMP::OpenMP_CXX)
  target_compile_definitions(kvstore_device_omp INTERFACE THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP)
  # /usr/include is searched anyway; naming it with -isystem would break the C++ headers'
  # #include_next.
  if(NOT KVSTORE_THRUST_INCLUDE_DIR STREQUAL "/usr/include")
    target_include_directories(kvstore_device_omp SYSTEM INTERFACE ${KVSTORE_THRUST_INCLUDE_DIR})
  endif()

  include(CheckLanguage)
  check_language(CUDA)
  set(_kvstore_cuda_default OFF)
  if(CMAKE_CUDA_COMPILER AND NOT KVSTORE_SANITIZE)  # nvcc takes no -fsanitize
    set(_kvstore_cuda_default ON)
  endif()
  option(KVSTORE_BUILD_DEVICE_CUDA "Also compile the CUDA build of the device tests and benchmarks (nvcc)" ${_kvstore_cuda_default})
  if(KVSTORE_BUILD_DEVICE_CUDA)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100/H200); override on the command line
    endif()
    enable_language(CUDA)
  endif()
endif()

# kvstore_cuda_target(TARGET): compile options of a CUDA build of the device code. CMake 3.25
# knows no CUDA_STANDARD 20, so -std=c++20 is passed by hand (without it a .cu file is silently
# C++17); Asio's variable templates do not get through nvcc, so its SFINAE fallback is chosen.
function(kvstore_cuda_target target)
  target_link_libraries(${target} PRIVATE kvstore::kvstore)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr>)
  target_compile_definitions(${target} PRIVATE BOOST_ASIO_DISABLE_SFINAE_VARIABLE_TEMPLATES)
  if(NOT KVSTORE_THRUST_INCLUDE_DIR STREQUAL "/usr/include" AND KVSTORE_THRUST_INCLUDE_DIR MATCHES "cccl")
    target_include_directories(${target} SYSTEM PRIVATE ${KVSTORE_THRUST_INCLUDE_DIR})
  endif()
endfunction()
