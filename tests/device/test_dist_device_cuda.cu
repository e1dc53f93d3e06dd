// The CUDA build of test_dist_device.cpp (nvcc: real GPUs; exits 77 when none is visible).
#include "test_dist_device.cpp"
