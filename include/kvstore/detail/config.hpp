// The build mode. Header-only by default: every body is in the headers. With
// KVSTORE_SEPARATE_COMPILATION defined in every source file of a program, the public headers
// declare only, and the one file that includes <kvstore/src.hpp> (or the kvstore::compiled
// library) holds the bodies: a non-template function is declared KVSTORE_DECL, `inline` in
// header-only builds and an ordinary declaration otherwise.
#pragma once

#ifdef KVSTORE_SEPARATE_COMPILATION
#define KVSTORE_DECL
#else
#define KVSTORE_DECL inline
#endif
