# Helpers that turn a source folder into a library plus one GoogleTest binary.
#
# fsdp_sources(OUT_SRCS OUT_TESTS DIR): every *.cc under DIR (recursively); files ending in
# _test.cc go to OUT_TESTS, the rest to OUT_SRCS. Files under a `gloo/`, `nccl/` or `cuda/`
# folder and *_cuda.cc files are left out; backend folders add them explicitly. Non-test files
# under a `testing/` folder (test-only helpers, e.g. engine/testing -> fsdp_testing) are left
# out of OUT_SRCS too: the folder's CMakeLists builds them into a testing library of their own.
function(fsdp_sources out_srcs out_tests dir)
  file(GLOB_RECURSE all CONFIGURE_DEPENDS ${dir}/*.cc)
  set(srcs)
  set(tests)
  foreach(f IN LISTS all)
    file(RELATIVE_PATH rel ${dir} ${f})
    if(rel MATCHES "(^|/)(gloo|nccl|cuda)/" OR rel MATCHES "_cuda\\.cc$")
      continue()
    endif()
    if(f MATCHES "_test\\.cc$")
      list(APPEND tests ${f})
    elseif(rel MATCHES "(^|/)testing/")
      continue()
    else()
      list(APPEND srcs ${f})
    endif()
  endforeach()
  set(${out_srcs} ${srcs} PARENT_SCOPE)
  set(${out_tests} ${tests} PARENT_SCOPE)
endfunction()

# fsdp_add_test_binary(NAME SOURCES... LIBS...): a gtest binary discovered by ctest.
function(fsdp_add_test_binary name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT FSDP_BUILD_TESTS OR NOT ARG_SOURCES)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest_main GTest::gmock Threads::Threads)
  set(labels unit)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  if(labels STREQUAL "unit")
    # [Note: gpu test names] In a mixed binary, a test that needs a CUDA device has a suite
    # name ending in "Gpu" (FsdpGpu.MlpWorld1MatchesCpu); it gets the label gpu, the rest unit.
    gtest_discover_tests(${name} TEST_FILTER "-*Gpu.*" DISCOVERY_TIMEOUT 60
                         PROPERTIES TIMEOUT 300 LABELS unit)
    gtest_discover_tests(${name} TEST_FILTER "*Gpu.*" DISCOVERY_TIMEOUT 60
                         PROPERTIES TIMEOUT 300 LABELS gpu)
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS "${labels}")
  endif()
endfunction()
