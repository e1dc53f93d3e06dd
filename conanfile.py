"""Conan 2 recipe for kvstore, a C++20 parameter server: header-only (the default) or, with
-o "kvstore/*:header_only=False", also the static library kvstore::compiled (its users build with
KVSTORE_SEPARATE_COMPILATION).

Offline with Debian's Boost and OpenSSL:  bash scripts/conan-create.sh [-o "kvstore/*:header_only=False"]
With ConanCenter:                         conan create . --build=missing -s compiler.cppstd=20
"""
import os

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load
import re


class KvstoreConan(ConanFile):
    name = "kvstore"
    description = "C++20 parameter server with MXNet's KVStore API, header-only or compiled"
    topics = ("parameter-server", "kvstore", "distributed-training", "header-only")
    settings = "os", "arch", "compiler", "build_type"
    options = {"header_only": [True, False]}
    default_options = {"header_only": True}
    exports_sources = "include/*", "src/*", "CMakeLists.txt", "cmake/*"
    no_copy_source = True

    def configure(self):
        self.package_type = "header-library" if self.options.header_only else "static-library"

    def layout(self):
        cmake_layout(self)

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
        if self.info.options.header_only:
            self.info.clear()

    def generate(self):
        if self.options.header_only:
            return
        CMakeDeps(self).generate()
        tc = CMakeToolchain(self)
        for opt in ("TESTS", "EXAMPLES", "BENCHMARKS", "DOCS"):
            tc.cache_variables[f"KVSTORE_BUILD_{opt}"] = False
        tc.generate()

    def build(self):
        if self.options.header_only:
            return
        cmake = CMake(self)
        cmake.configure()
        cmake.build(target="kvstore_compiled")

    def package(self):
        copy(self, "*", os.path.join(self.source_folder, "include"),
             os.path.join(self.package_folder, "include"))
        if not self.options.header_only:
            copy(self, "*.a", self.build_folder, os.path.join(self.package_folder, "lib"),
                 keep_path=False)

    def package_info(self):
        # kvstore::kvstore (the headers) always; kvstore::compiled beside it when built.
        self.cpp_info.set_property("cmake_file_name", "kvstore")
        self.cpp_info.set_property("cmake_target_name", "kvstore::kvstore_all")
        headers = self.cpp_info.components["headers"]
        headers.set_property("cmake_target_name", "kvstore::kvstore")
        headers.bindirs = []
        headers.libdirs = []
        headers.requires = ["boost::headers", "boost::serialization",
                            "openssl::crypto", "openssl::ssl"]
        if self.settings.os in ("Linux", "FreeBSD"):
            headers.system_libs = ["pthread"]
        if not self.options.header_only:
            compiled = self.cpp_info.components["compiled"]
            compiled.set_property("cmake_target_name", "kvstore::compiled")
            compiled.libs = ["kvstore"]
            compiled.defines = ["KVSTORE_SEPARATE_COMPILATION"]
            compiled.includedirs = []
            compiled.bindirs = []
            compiled.requires = ["headers"]
