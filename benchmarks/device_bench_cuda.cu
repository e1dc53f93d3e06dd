// The CUDA build of device_bench.cpp (exits 77 when no GPU is visible).
#include "device_bench.cpp"
