// The umbrella: everything an application needs, local and distributed.
//   #include <kvstore/kvstore.hpp>
//   kvstore::KVStore<kvstore::local> kv;   kvstore::KVStore<kvstore::dist> kv;
// Local-only code may include <kvstore/local.hpp> alone (no Asio, faster builds); a worker that is
// never launched SPMD may include <kvstore/dist.hpp> without the server loop (spmd.hpp).
#pragma once

#include <kvstore/colocated.hpp>
#include <kvstore/dist.hpp>
#include <kvstore/error.hpp>
#include <kvstore/fwd.hpp>
#include <kvstore/local.hpp>
#include <kvstore/optim/all.hpp>
#include <kvstore/options.hpp>
#include <kvstore/spmd.hpp>
