// The CUDA build of test_device.cpp (nvcc: real GPUs; exits 77 when none is visible).
#include "test_device.cpp"
