// KVStore<device, T>: the opt-in GPU store (the only public header that needs Thrust, and CUDA on
// a CUDA build). Build with nvcc and Thrust's CUDA backend for GPUs, or with any C++20 compiler,
// -fopenmp and -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP for virtual devices over host
// memory (the same program then runs on a CPU). kvstore.hpp does not include this header.
// Included, it also gives KVStore<dist> its device_span calls (MXNet's dist_device_sync:
// device/dist_calls.hpp), whichever of the two headers comes first.
#pragma once

#include <kvstore/device/buffer.hpp>
#include <kvstore/device/dist_bridge.hpp>
#include <kvstore/device/dist_calls.hpp>
#include <kvstore/device/runtime.hpp>
#include <kvstore/device/span.hpp>
#include <kvstore/device/staging.hpp>
#include <kvstore/device/store.hpp>
