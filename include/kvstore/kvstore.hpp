// The umbrella: everything an application needs, local and distributed.
//   #include <kvstore/kvstore.hpp>
//   kvstore::KVStore<kvstore::local> kv;   kvstore::KVStore<kvstore::dist> kv;
// Local-only code may include <kvstore/local.hpp> alone (no Asio, faster builds). With
// KVSTORE_SEPARATE_COMPILATION (detail/config.hpp) the distributed parts are only declared here.
#pragma once

#include <kvstore/dist.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/local.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>
#include <kvstore/serve.hpp>
#include <kvstore/spmd.hpp>
