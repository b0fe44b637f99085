# nb_tokenizer: text <-> token ids for the tools around the worker (generate
# CLI, tests, benchmarks): HF byte-level BPE tokenizer.json and llama2.c
# tokenizer.bin. include()d from worker/CMakeLists.txt; paths are relative to
# this file and the guard makes a second include harmless.
if(NOT TARGET nb_tokenizer)
  add_library(nb_tokenizer STATIC ${CMAKE_CURRENT_LIST_DIR}/tokenizer.c)
  target_include_directories(nb_tokenizer PUBLIC ${CMAKE_CURRENT_LIST_DIR}
                             ${PROJECT_SOURCE_DIR}/kernels) # nb_status.h
  target_link_libraries(nb_tokenizer PRIVATE PkgConfig::CJSON)
endif()
