# GPU tests and benchmarks (CUDA builds only). The test exits 77 (ctest SKIP)
# on a machine without a GPU, so CI stays green; of the benchmark only its
# argument checks run in ctest (tests/gpu/run runs both on a GPU machine
# from a bundle).
if(NIBBLER_HAVE_CUDA AND TARGET nb_kernels_cuda)
  add_executable(test_kv_cache_cuda ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_kv_cache_cuda.cu)
  target_link_libraries(test_kv_cache_cuda PRIVATE nb_kernels_cuda nb_kernels nb_block_manager
                        nb_worker_core CUDA::cudart ${MATH_LIBRARY})
  target_compile_options(test_kv_cache_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
  add_test(NAME test_kv_cache_cuda COMMAND test_kv_cache_cuda)
  set_tests_properties(test_kv_cache_cuda PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77
                       ENVIRONMENT "NB_SHARED_DIR=${NIBBLER_SHARED_DIR}" LABELS gpu)

  add_executable(bench_attention_cuda ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_attention_cuda.cu)
  target_link_libraries(bench_attention_cuda PRIVATE nb_kernels_cuda CUDA::cudart)
  # Its argument checks come before any GPU use: this runs everywhere.
  add_test(NAME bench_attention_cuda_args
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/gpu/bench_bad_args.sh $<TARGET_FILE:bench_attention_cuda>)
  set_tests_properties(bench_attention_cuda_args PROPERTIES TIMEOUT 120)

  # A diagnostic: per-SM streaming rates of three copy mechanisms (not a test).
  add_executable(probe_sm_rates ${CMAKE_CURRENT_SOURCE_DIR}/bench/probe_sm_rates.cu)
  target_link_libraries(probe_sm_rates PRIVATE CUDA::cudart)

  add_executable(bench_prefill_attention ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_prefill_attention.cu)
  target_link_libraries(bench_prefill_attention PRIVATE nb_kernels_cuda CUDA::cudart)
  add_test(NAME bench_prefill_attention_args
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/gpu/bench_prefill_bad_args.sh
                   $<TARGET_FILE:bench_prefill_attention>)
  set_tests_properties(bench_prefill_attention_args PROPERTIES TIMEOUT 120)
endif()
