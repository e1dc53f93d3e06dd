"""openssl/3.0.19 as Debian 12 provides it (libssl-dev), described to Conan; packages nothing.

kvstore authenticates connections with libcrypto (HMAC-SHA256) and links libssl for TLS. The
CMake names are those of CMake's FindOpenSSL and of ConanCenter's openssl recipe (OpenSSL::Crypto,
OpenSSL::SSL), so kvstore's recipe works unchanged with either. Export it to the local cache
(`conan export conan/openssl-system`) to build kvstore offline.
"""
from conan import ConanFile


class OpenSSLSystemConan(ConanFile):
    name = "openssl"
    version = "3.0.19"  # Debian 12's libssl-dev; only a label here, nothing is downloaded or built
    description = "The system's OpenSSL 3 (Debian's libssl-dev), described to Conan; packages nothing"
    license = "Apache-2.0"
    package_type = "shared-library"
    settings = "os", "arch", "compiler", "build_type"

    def package_id(self):
        self.info.clear()

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "OpenSSL")
        self.cpp_info.set_property("cmake_target_name", "openssl::openssl")

        crypto = self.cpp_info.components["crypto"]
        crypto.set_property("cmake_target_name", "OpenSSL::Crypto")
        crypto.system_libs = ["crypto"]

        ssl = self.cpp_info.components["ssl"]
        ssl.set_property("cmake_target_name", "OpenSSL::SSL")
        ssl.requires = ["crypto"]
        ssl.system_libs = ["ssl"]

        for component in (crypto, ssl):
            component.includedirs = []  # /usr/include, where the compiler already looks
            component.libdirs = []
            component.bindirs = []
