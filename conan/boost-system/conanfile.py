"""boost/1.81.0 as Debian 12 provides it (libboost1.81-dev, libboost-serialization1.81-dev).

Packages nothing: it tells Conan that Boost's headers are on the system include path and that
Boost.Serialization links as -lboost_serialization, with the CMake targets Boost's own config
defines (Boost::headers, Boost::serialization). Export it to the local cache
(`conan export conan/boost-system`) to build kvstore offline; with ConanCenter, the real
boost/1.81.0 recipe is used instead and kvstore's recipe does not change.
"""
from conan import ConanFile


class BoostSystemConan(ConanFile):
    name = "boost"
    version = "1.81.0"
    description = "The system's Boost 1.81 (Debian packages), described to Conan; packages nothing"
    license = "BSL-1.0"
    # A shared library as far as consumers are concerned: they link it, Conan copies nothing.
    package_type = "shared-library"
    settings = "os", "arch", "compiler", "build_type"

    def package_id(self):
        self.info.clear()  # nothing is built: one package for every configuration

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "Boost")
        self.cpp_info.set_property("cmake_target_name", "Boost::boost")

        headers = self.cpp_info.components["headers"]
        headers.set_property("cmake_target_name", "Boost::headers")
        headers.includedirs = []  # /usr/include, where the compiler already looks
        headers.libdirs = []
        headers.bindirs = []

        serialization = self.cpp_info.components["serialization"]
        serialization.set_property("cmake_target_name", "Boost::serialization")
        serialization.requires = ["headers"]
        serialization.system_libs = ["boost_serialization"]
        serialization.includedirs = []
        serialization.libdirs = []
        serialization.bindirs = []
