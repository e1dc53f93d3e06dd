// doctest's implementation, compiled once into the kvtest_doctest library that every test program
// links (tests/CMakeLists.txt). Each test source includes <doctest/doctest.h> alone: compiling
// the implementation in every test took about 7 s of each one's build (g++ -O2), some 7 minutes
// of CPU over a full build.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
