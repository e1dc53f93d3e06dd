// Colocated servers (dist_options::colocated, BigDL's layout): KVStore<dist> starts a colocated
// worker's own server (and rank 0's scheduler in an SPMD launch) itself (roles/colocated.hpp), so
// nothing needs to be included for it; this header stays for the programs that include it.
#pragma once

#include <kvstore/dist.hpp>
