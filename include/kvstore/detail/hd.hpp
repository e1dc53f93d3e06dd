// KVSTORE_HD marks small inline functions that both the CPU code and CUDA kernels call (the
// optimizers' element-wise arithmetic), so the two share one definition. Without nvcc it is
// empty and these headers stay plain C++.
#pragma once

#if defined(__CUDACC__)
#define KVSTORE_HD __host__ __device__
#else
#define KVSTORE_HD
#endif
