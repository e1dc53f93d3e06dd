// Serving on purpose: a program that runs a scheduler or a server (kv_server, a test, an
// embedding) calls kvstore::serve or owns a kvstore::node_loop (decl/serve.hpp). Header-only
// builds get their bodies here too (roles/node_loop.hpp); with KVSTORE_SEPARATE_COMPILATION they
// are in <kvstore/src.hpp>, and this header needs no Asio.
#pragma once

#include <kvstore/decl/serve.hpp>
#ifndef KVSTORE_SEPARATE_COMPILATION
#include <kvstore/roles/node_loop.hpp>
#endif
