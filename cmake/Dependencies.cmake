# Finds every dependency. Debian packages are installed by scripts/setup.sh.
find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)            # Eigen3::Eigen
find_package(nlohmann_json 3 CONFIG REQUIRED)          # nlohmann_json::nlohmann_json
find_package(Gloo CONFIG REQUIRED)                     # target: gloo (not namespaced)
if(FSDP_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)                  # GTest::gtest_main, GTest::gmock
endif()

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

# CUDA is optional: built whenever nvcc is present (see docs environment notes).
set(FSDP_HAVE_CUDA 0)
set(FSDP_HAVE_NCCL 0)
if(FSDP_ENABLE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)  # CMake < 3.26 lacks nvcc's C++20 flag
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    find_package(CUDAToolkit REQUIRED)
    set(FSDP_HAVE_CUDA 1)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} $ENV{NCCL_HOME}/lib)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      add_library(fsdp_nccl_imported UNKNOWN IMPORTED)
      set_target_properties(fsdp_nccl_imported PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                            INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
      set(FSDP_HAVE_NCCL 1)
    endif()
  endif()
endif()
message(STATUS "fsdp: CUDA=${FSDP_HAVE_CUDA} NCCL=${FSDP_HAVE_NCCL}")
