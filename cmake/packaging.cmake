# How ukprobes is installed and packaged, beyond the targets' own install() rules
# (src/CMakeLists.txt, tools/ukprobe/CMakeLists.txt): the CMake package that
# find_package(ukprobes CONFIG) reads, ukprobes.pc for pkg-config, the documents, and the
# Debian package that `cpack -G DEB` makes of the whole installation.
include(CMakePackageConfigHelpers)

set(UKP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ukprobes)

# ukprobes::ukprobes, the shared library, needs nothing of its users but the headers.
# ukprobes::ukprobes_static, the static library, needs the libraries its objects call
# (Zydis, libelf, libdw, fmt, threads, libdl): ukprobesConfig.cmake defines it only when those
# are found.
install(EXPORT ukprobesTargets NAMESPACE ukprobes:: DESTINATION ${UKP_CMAKE_DIR})
install(EXPORT ukprobesStaticTargets NAMESPACE ukprobes:: DESTINATION ${UKP_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ukprobesConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ukprobesConfig.cmake INSTALL_DESTINATION ${UKP_CMAKE_DIR})
# 0.x releases share the library's SONAME, libukprobes.so.0.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ukprobesConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ukprobesConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/ukprobesConfigVersion.cmake DESTINATION ${UKP_CMAKE_DIR})

# ukprobes.pc names its directories relative to its own place, so that the installation
# can be moved (cmake --install --prefix DIR) and still be found through PKG_CONFIG_PATH.
file(RELATIVE_PATH UKP_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
file(RELATIVE_PATH UKP_PC_LIBDIR ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_LIBDIR})
file(RELATIVE_PATH UKP_PC_INCLUDEDIR ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_INCLUDEDIR})
configure_file(${CMAKE_CURRENT_LIST_DIR}/ukprobes.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ukprobes.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ukprobes.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The documents the manual page points to, for the users of ukprobe and of the library
# (PREFIX/share/doc/ukprobes).
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/guide.md ${PROJECT_SOURCE_DIR}/docs/cli.md
  ${PROJECT_SOURCE_DIR}/docs/tracer.md ${PROJECT_SOURCE_DIR}/docs/reference.md
  ${PROJECT_SOURCE_DIR}/docs/performance.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR})

# The Debian package: everything above, installed under the prefix the build was
# configured with (configure with -DCMAKE_INSTALL_PREFIX=/usr for a system package).
# Its dependencies are those dpkg-shlibdeps finds for the binaries (libZydis, libelf,
# libfmt, libfuse3, ...).
set(CPACK_PACKAGE_NAME ukprobes)
set(CPACK_PACKAGE_VENDOR ukprobes)
set(UKP_PACKAGE_MAINTAINER "ukprobes maintainers <ukprobes@localhost>" CACHE STRING
  "The Maintainer field of the Debian package (cpack -G DEB): NAME <EMAIL>")
set(CPACK_PACKAGE_CONTACT "${UKP_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "the Linux kernel's Kprobes for user-space processes")
set(CPACK_PACKAGE_DESCRIPTION
  "ukprobes brings the kernel's Kprobes API (struct kprobe, register_kprobe, kretprobes,\
 jprobes) and its kprobe-based event tracer to ordinary user-space processes on Linux\
 x86-64. This package holds the agent libukprobes.so (and libukprobes.a), the headers, the\
 CMake and pkg-config files to build against it, and the ukprobe command, which traces a\
 program from its start (ukprobe run) or attaches to a running one.")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
include(CPack)
