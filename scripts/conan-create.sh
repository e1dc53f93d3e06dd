#!/usr/bin/env bash
# Builds and tests the Conan package offline: Boost and OpenSSL come from the system (Debian),
# described to Conan by conan/boost-system and conan/openssl-system. Extra arguments go to `conan create`.
# Environment: CONAN_HOME (default: Conan's own, ~/.conan2), KVSTORE_CONAN_WORK: if set, a scratch
# folder the recipe is copied to first, so the run leaves nothing in the source tree (the ctest
# test uses this).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -n ${KVSTORE_CONAN_WORK:-} ]]; then
  rm -rf "$KVSTORE_CONAN_WORK"
  mkdir -p "$KVSTORE_CONAN_WORK"
  cp -r conanfile.py CMakeLists.txt cmake include src conan "$KVSTORE_CONAN_WORK"/
  mkdir "$KVSTORE_CONAN_WORK/test_package"
  cp test_package/conanfile.py test_package/CMakeLists.txt test_package/*.cpp "$KVSTORE_CONAN_WORK/test_package/"
  cd "$KVSTORE_CONAN_WORK"
fi

set -x
conan profile detect --exist-ok
conan export conan/boost-system
conan export conan/openssl-system
conan create . --build=missing -nr -s compiler.cppstd=20 "$@"
