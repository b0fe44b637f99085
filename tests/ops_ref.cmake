# Reference ops, weight quantization and sampling (kernels/ops_ref, wquant,
# sampling): unit tests against double-precision loops and the math.
nb_add_test(test_ops_ref SOURCES ${CMAKE_CURRENT_LIST_DIR}/unit/test_ops_ref.c
            LIBS nb_kernels LABELS unit TIMEOUT 120)
nb_add_test(test_wquant SOURCES ${CMAKE_CURRENT_LIST_DIR}/unit/test_wquant.c
            LIBS nb_kernels LABELS unit TIMEOUT 120)
nb_add_test(test_sampling SOURCES ${CMAKE_CURRENT_LIST_DIR}/unit/test_sampling.c
            LIBS nb_kernels LABELS unit TIMEOUT 300)
