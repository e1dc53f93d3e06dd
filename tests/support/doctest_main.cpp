// The main() of a test program that does not define its own. It lives in the kvtest_doctest
// static library, so the linker takes it only when the test's objects leave main undefined: a
// test with its own main() (one that runs as a child process too) keeps it.
#include <doctest/doctest.h>

int main(int argc, char** argv) { return doctest::Context(argc, argv).run(); }
