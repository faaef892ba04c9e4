# `cmake --install build [--prefix P]` lays out:
#   P/include/ember/ember.h, accelerate.h, cuda.h, version.h   the headers users include
#   P/include/ember/<room>/...                                 the headers those include
#   P/lib/libember.so, P/bin/ember
#   P/lib/cmake/Ember/   find_package(Ember) -> Ember::ember (components CUDA, distributed)
#   P/lib/pkgconfig/ember.pc
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(EMBER_HEADER_ROOT ${CMAKE_INSTALL_INCLUDEDIR}/ember)
# Public headers include the room headers as "core/tensor.h": both include/ and include/ember/
# are on an installed consumer's include path.
target_include_directories(ember PUBLIC
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
  $<INSTALL_INTERFACE:${EMBER_HEADER_ROOT}>)

install(TARGETS ember EXPORT EmberTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET ember_cli)
  # The installed command finds the installed library wherever the prefix is moved.
  set_target_properties(ember_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS ember_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ember/ DESTINATION ${EMBER_HEADER_ROOT}
        FILES_MATCHING PATTERN "*.h")
set(EMBER_HEADER_ROOMS core autograd nn optim data tracking distributed accelerate kernels/shared)
if(EMBER_CUDA)
  list(APPEND EMBER_HEADER_ROOMS kernels/cuda)
endif()
foreach(room ${EMBER_HEADER_ROOMS})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${room}/ DESTINATION ${EMBER_HEADER_ROOT}/${room}
          FILES_MATCHING PATTERN "*.h")
endforeach()

configure_file(${PROJECT_SOURCE_DIR}/cmake/version.h.in ${PROJECT_BINARY_DIR}/include/ember/version.h @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/include/ember/version.h DESTINATION ${EMBER_HEADER_ROOT})

install(EXPORT EmberTargets NAMESPACE Ember:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/EmberConfig.cmake.in
  ${PROJECT_BINARY_DIR}/EmberConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/EmberConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/EmberConfig.cmake ${PROJECT_BINARY_DIR}/EmberConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Ember)

set(EMBER_PC_DEFINES "")
if(EMBER_CUDA)
  list(JOIN CUDAToolkit_INCLUDE_DIRS " -I" cuda_includes)
  set(EMBER_PC_DEFINES "-DEMBER_WITH_CUDA=1 -DEMBER_WITH_NCCL=1 -I${cuda_includes}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/ember.pc.in ${PROJECT_BINARY_DIR}/ember.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ember.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
