# GPU twins of the dense ops and of sampling (kernels/ops_cuda, sampling_cuda)
# against the C reference: bit-exact where the contract says so, named
# tolerances elsewhere. Exits 77 (skipped) on a machine without a GPU.
if(NIBBLER_HAVE_CUDA AND TARGET nb_kernels_cuda)
  nb_add_test(test_ops_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/gpu/test_ops_cuda.cu
              LIBS nb_kernels_cuda nb_kernels LABELS gpu TIMEOUT 600)
  if(TARGET test_ops_cuda)
    # NOTE: the host half compares bit patterns with the C reference; keep
    # nvcc from contracting its own arithmetic into fma.
    target_compile_options(test_ops_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false>)
  endif()
endif()
