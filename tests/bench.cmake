# Benchmarks: executables that print figures. Each also runs once as a short
# smoke test so CI keeps them building and running; speed is never asserted.
add_executable(bench_block_manager ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_block_manager.c)
target_link_libraries(bench_block_manager PRIVATE nb_block_manager)
add_test(NAME bench_block_manager_smoke COMMAND bench_block_manager 64 4 50 64)
