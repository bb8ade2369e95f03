# Install and export rules: `cmake --install BUILD --prefix P` lays out a relocatable CMake
# package `fsdp_conformance` under P (docs/in_process.md):
#
#   P/include/{engine,fakes,reference,conformance}/...   the headers, at their source paths
#   P/include/fsdp/config.h                              the generated feature switches
#   P/lib/libfsdp_{engine,fakes,reference,conformance}.a
#   P/bin/fsdp-conform                                   the CLI
#   P/lib/cmake/fsdp_conformance/                        the package (config, version, targets)
#
# `find_package(fsdp_conformance CONFIG REQUIRED)` then gives the imported targets
# fsdp::engine, fsdp::fakes, fsdp::reference and fsdp::conformance (the one a linked-in subject
# needs; it brings the others), and finds their dependencies again (fsdp_conformanceConfig.cmake.in).
# Test-only folders (engine/testing, conformance/testing) are not installed.
# Included once, from the top-level CMakeLists.txt, after every target is defined.
include(CMakePackageConfigHelpers)

set(FSDP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/fsdp_conformance)
set(FSDP_EXPORTED_LIBRARIES fsdp_engine fsdp_fakes fsdp_reference fsdp_conformance)

foreach(lib IN LISTS FSDP_EXPORTED_LIBRARIES)
  string(REPLACE "fsdp_" "" export_name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${export_name})
endforeach()
install(TARGETS ${FSDP_EXPORTED_LIBRARIES} EXPORT fsdp_conformance_targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET fsdp-conform)
  install(TARGETS fsdp-conform RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

foreach(dir IN ITEMS engine fakes reference conformance)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh"
          PATTERN "testing" EXCLUDE)
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/fsdp/config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fsdp)

install(EXPORT fsdp_conformance_targets NAMESPACE fsdp:: FILE fsdp_conformanceTargets.cmake
        DESTINATION ${FSDP_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/fsdp_conformanceConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/fsdp_conformanceConfig.cmake
                              INSTALL_DESTINATION ${FSDP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/fsdp_conformanceConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/fsdp_conformanceConfig.cmake
              ${PROJECT_BINARY_DIR}/fsdp_conformanceConfigVersion.cmake
        DESTINATION ${FSDP_INSTALL_CMAKEDIR})
