// KVStore<dist, T>: a worker of a distributed job (decl/dist.hpp has the calls and their contract).
// Header-only builds get the bodies here too (impl/dist.hpp); with KVSTORE_SEPARATE_COMPILATION
// the program links them from the one source file that includes <kvstore/src.hpp> (or from
// kvstore::compiled), and this header costs no more to compile than the options and optimizers.
// In a process whose role is server or scheduler (mpirun-style SPMD launches) the constructor runs
// that role and exits the process, as MXNet does.
#pragma once

#include <kvstore/decl/dist.hpp>
#ifndef KVSTORE_SEPARATE_COMPILATION
#include <kvstore/impl/dist.hpp>
#endif
