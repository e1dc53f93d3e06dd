// The compiled part of kvstore: include this in exactly one source file of a program whose every
// source file defines KVSTORE_SEPARATE_COMPILATION (the CMake target kvstore::compiled is that
// file, built once). It holds the bodies the public headers only declare in that mode: the
// worker (KVStore<dist, float> and KVStore<dist, double>), the server and the scheduler
// (kvstore::serve, kvstore::node_loop), and what a worker runs beside itself (an SPMD role, a
// colocated server).
#pragma once

#ifndef KVSTORE_SEPARATE_COMPILATION
#error \
    "<kvstore/src.hpp> is for KVSTORE_SEPARATE_COMPILATION builds: define it in every source file"
#endif

#include <kvstore/kvstore.hpp>
//
#include <kvstore/impl/dist.hpp>
#include <kvstore/roles/node_loop.hpp>

namespace kvstore {
template class KVStore<dist, float>;
template class KVStore<dist, double>;
}  // namespace kvstore
