# CUDA linear layers (kernels/linear_cuda.cu): the GPU test against the C
# references and the bandwidth benchmark. Both exit 77 (skipped) when no
# CUDA device is present, so CI without a GPU stays green.
if(NIBBLER_HAVE_CUDA AND TARGET nb_kernels_cuda)
  foreach(_nb_gl test_linear_cuda test_dense_ri_cuda bench_linear_cuda)
    if(_nb_gl MATCHES "^test_")
      set(_nb_gl_src ${CMAKE_CURRENT_LIST_DIR}/gpu/${_nb_gl}.cu)
    else()
      set(_nb_gl_src ${CMAKE_CURRENT_LIST_DIR}/bench/bench_linear_cuda.cu)
    endif()
    if(NOT EXISTS ${_nb_gl_src})
      message(WARNING "${_nb_gl}: ${_nb_gl_src} does not exist; not built")
      continue()
    endif()
    add_executable(${_nb_gl} ${_nb_gl_src})
    target_link_libraries(${_nb_gl} PRIVATE nb_kernels_cuda nb_kernels Threads::Threads
                          ${MATH_LIBRARY})
    target_include_directories(${_nb_gl} PRIVATE ${CMAKE_CURRENT_LIST_DIR})
    set_target_properties(${_nb_gl} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
    target_compile_options(${_nb_gl} PRIVATE
                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  endforeach()
  # The launch-timeline diagnostic: compiles linear_cuda.cu itself with its
  # NB_WQ_TRACE hooks, so it does not link nb_kernels_cuda. Built, never run
  # by ctest (it measures, it checks nothing).
  set(_nb_tr_src ${CMAKE_CURRENT_LIST_DIR}/bench/trace_linear_cuda.cu)
  if(EXISTS ${_nb_tr_src})
    add_executable(trace_linear_cuda ${_nb_tr_src})
    target_link_libraries(trace_linear_cuda PRIVATE nb_kernels CUDA::cudart CUDA::cublas
                          Threads::Threads ${MATH_LIBRARY})
    set_target_properties(trace_linear_cuda PROPERTIES CUDA_STANDARD 17
                          CUDA_STANDARD_REQUIRED ON)
    target_compile_options(trace_linear_cuda PRIVATE
                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  endif()
  if(TARGET test_linear_cuda)
    add_test(NAME test_linear_cuda COMMAND test_linear_cuda)
    set_tests_properties(test_linear_cuda PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
                         LABELS gpu)
  endif()
  if(TARGET test_dense_ri_cuda)
    add_test(NAME test_dense_ri_cuda COMMAND test_dense_ri_cuda)
    set_tests_properties(test_dense_ri_cuda PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
                         LABELS gpu)
  endif()
  if(TARGET bench_linear_cuda)
    # Smoke run of the benchmark (one shape, few iterations); speed never fails it.
    add_test(NAME bench_linear_cuda_smoke COMMAND bench_linear_cuda --quick)
    set_tests_properties(bench_linear_cuda_smoke PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                         LABELS "gpu;bench")
    # Its argument checks come before any GPU use: this runs everywhere.
    add_test(NAME bench_linear_cuda_args
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/gpu/bench_linear_bad_args.sh
                     $<TARGET_FILE:bench_linear_cuda>)
    set_tests_properties(bench_linear_cuda_args PROPERTIES TIMEOUT 120)
  endif()
endif()
