# device_bench (benchmarks/device_bench.cpp), when the device store is built: the OMP build here,
# in build/benchmarks (its --quick runs in a few seconds on a CPU), and with nvcc the CUDA build in
# build/benchmarks/cuda/, out of the --quick smoke run of scripts/test.sh (it needs a GPU: without
# one it exits 77).
if(KVSTORE_BUILD_DEVICE)
  add_executable(device_bench ${CMAKE_CURRENT_LIST_DIR}/device_bench.cpp)
  target_link_libraries(device_bench PRIVATE kvstore::device_omp)
  target_compile_options(device_bench PRIVATE -O3 -Wall -Wextra)
  if(KVSTORE_BUILD_DEVICE_CUDA)
    add_executable(device_bench_cuda ${CMAKE_CURRENT_LIST_DIR}/device_bench_cuda.cu)
    kvstore_cuda_target(device_bench_cuda)
    set_target_properties(device_bench_cuda PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/cuda)
  endif()
endif()
