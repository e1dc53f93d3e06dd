// kvstore::compiled: the one translation unit that holds the bodies a KVSTORE_SEPARATE_COMPILATION
// build declares only (include/kvstore/src.hpp). CMake builds it as a static library and sets the
// define for every target that links it.
#include <kvstore/src.hpp>
