# Benchmarks: executables that print figures. Each also runs once as a short
# smoke test so CI keeps them building and running; speed is never asserted.
add_executable(bench_block_manager ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_block_manager.c)
target_link_libraries(bench_block_manager PRIVATE nb_block_manager)
add_test(NAME bench_block_manager_smoke COMMAND bench_block_manager 64 4 50 64)

add_executable(bench_acceptance ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_acceptance.c)
target_link_libraries(bench_acceptance PRIVATE nb_worker_core nb_tokenizer PkgConfig::CJSON)
if(EXISTS ${NIBBLER_SHARED_DIR}/models/proxy-llama-31m)
  add_test(NAME bench_acceptance_smoke
           COMMAND bench_acceptance ${NIBBLER_SHARED_DIR}/models/proxy-llama-31m
                   ${NIBBLER_SHARED_DIR}/data --n-prompts 1 --gen 4 --ablations both --ppl 40)
  set_tests_properties(bench_acceptance_smoke PROPERTIES TIMEOUT 900)
endif()
