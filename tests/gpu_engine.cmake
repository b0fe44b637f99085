# The GPU engine end to end (CUDA builds only; exits 77 = SKIP without a GPU
# or without ../shared). tests/gpu/run runs it on the device from a bundle.
if(NIBBLER_HAVE_CUDA AND TARGET nb_kernels_cuda)
  nb_add_test(test_engine_cuda SOURCES gpu/test_engine_cuda.c
              LIBS nb_worker_core nb_tokenizer PkgConfig::CJSON CUDA::cudart
              TIMEOUT 1800 LABELS gpu)
  target_include_directories(test_engine_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit)
endif()

# End-to-end decoding speed on the GPU (an executable; tests/gpu/run runs it).
if(NIBBLER_HAVE_CUDA AND TARGET nb_kernels_cuda)
  add_executable(bench_engine_cuda ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_engine_cuda.c)
  target_link_libraries(bench_engine_cuda PRIVATE nb_worker_core nb_tokenizer PkgConfig::CJSON
                        CUDA::cudart ${MATH_LIBRARY})
  target_include_directories(bench_engine_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                             ${CMAKE_CURRENT_SOURCE_DIR}/unit)
endif()

# The engine at a real model shape and long context (synthetic weights by
# default): prefill tokens/s, target-only and speculative step times.
if(NIBBLER_HAVE_CUDA AND TARGET nb_kernels_cuda)
  add_executable(bench_engine_long ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_engine_long.c)
  target_link_libraries(bench_engine_long PRIVATE nb_worker_core CUDA::cudart ${MATH_LIBRARY})
  target_include_directories(bench_engine_long PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  add_test(NAME bench_engine_long_args
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/gpu/bench_engine_long_bad_args.sh $<TARGET_FILE:bench_engine_long>)
  set_tests_properties(bench_engine_long_args PROPERTIES TIMEOUT 300)
endif()
