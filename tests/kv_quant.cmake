# KV-cache layout, quantization reference and paged attention reference.
nb_add_test(test_kv_quant SOURCES unit/test_kv_quant.c LIBS nb_kernels LABELS unit TIMEOUT 120)
nb_add_test(test_attention_ref SOURCES unit/test_attention_ref.c LIBS nb_kernels LABELS unit TIMEOUT 120)
