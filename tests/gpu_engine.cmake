# The GPU engine end to end (CUDA builds only; exits 77 = SKIP without a GPU
# or without ../shared). tests/gpu/run runs it on the device from a bundle.
if(NIBBLER_HAVE_CUDA AND TARGET nb_kernels_cuda)
  nb_add_test(test_engine_cuda SOURCES gpu/test_engine_cuda.c
              LIBS nb_worker_core nb_tokenizer PkgConfig::CJSON CUDA::cudart
              TIMEOUT 1800 LABELS gpu)
  target_include_directories(test_engine_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit)
endif()
