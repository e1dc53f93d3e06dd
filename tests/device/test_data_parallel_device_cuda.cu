// The CUDA build of test_data_parallel_device.cpp (exits 77 when no GPU is visible).
#include "test_data_parallel_device.cpp"
