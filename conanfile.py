"""Conan 2 recipe for kvstore, a header-only C++20 parameter server.

Offline with Debian's Boost and OpenSSL:  bash scripts/conan-create.sh
With ConanCenter:                         conan create . --build=missing -s compiler.cppstd=20
"""
import os

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
import re


class KvstoreConan(ConanFile):
    name = "kvstore"
    description = "Header-only C++20 parameter server with MXNet's KVStore API"
    topics = ("parameter-server", "kvstore", "distributed-training", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    exports_sources = "include/*", "CMakeLists.txt", "cmake/*"
    no_copy_source = True

    def set_version(self):
        # One version, in CMakeLists.txt's project().
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        self.version = re.search(r"project\(kvstore VERSION (\S+)", text).group(1)

    def requirements(self):
        # Boost.Asio (headers) and Boost.Serialization (a library), both needed by consumers;
        # OpenSSL 3 for connection authentication (libcrypto) and TLS (libssl).
        self.requires("boost/1.81.0", transitive_headers=True, transitive_libs=True)
        self.requires("openssl/[>=3 <4]", transitive_headers=True, transitive_libs=True)

    def validate(self):
        check_min_cppstd(self, 20)

    def package_id(self):
        self.info.clear()

    def package(self):
        copy(self, "*", os.path.join(self.source_folder, "include"),
             os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "kvstore")
        self.cpp_info.set_property("cmake_target_name", "kvstore::kvstore")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.requires = ["boost::headers", "boost::serialization",
                                  "openssl::crypto", "openssl::ssl"]
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
