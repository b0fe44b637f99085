# Worker process tests: integration tests that spawn nibbler-worker on a
# private ipc socket (tests/integration/worker_harness.h), the request
# decoder's fuzz corpus replay, and the round-trip benchmark's smoke run.
function(nb_worker_test name src timeout)
  nb_add_test(${name} SOURCES ${src} LIBS nb_proto PkgConfig::ZMQ PkgConfig::JEMALLOC
              TIMEOUT ${timeout} LABELS worker ${ARGN})
  if(TARGET ${name})
    target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/integration)
    target_compile_definitions(${name} PRIVATE NB_WORKER_BIN="$<TARGET_FILE:nibbler-worker>")
    add_dependencies(${name} nibbler-worker)
  endif()
endfunction()

nb_worker_test(test_worker_bad_input integration/test_worker_bad_input.c 300)
nb_worker_test(test_worker_pressure integration/test_worker_pressure.c 300)
nb_worker_test(test_worker_flow integration/test_worker_flow.c 600)
nb_worker_test(test_worker_curve integration/test_worker_curve.c 300)
nb_worker_test(test_worker_sigterm integration/test_worker_sigterm.c 300)
# Boolean flags refuse a value and are documented in --help.
if(TARGET nibbler-worker)
  add_test(NAME worker_flags COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/integration/worker_flags.sh
           $<TARGET_FILE:nibbler-worker>)
  set_tests_properties(worker_flags PROPERTIES TIMEOUT 60 LABELS worker)
endif()

# The request decoder + validator: a libFuzzer target with clang, and in every
# build a plain driver that replays the committed corpus (tests/fuzz/corpus).
if(CMAKE_C_COMPILER_ID MATCHES Clang)
  add_executable(fuzz_request ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_request.c)
  target_compile_options(fuzz_request PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_request PRIVATE -fsanitize=fuzzer)
  target_link_libraries(fuzz_request PRIVATE nb_proto PkgConfig::JEMALLOC)
endif()
nb_add_test(test_fuzz_request_corpus SOURCES fuzz/fuzz_request.c fuzz/fuzz_replay.c
            LIBS nb_proto PkgConfig::JEMALLOC ARGS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus
            TIMEOUT 120 LABELS worker fuzz)
if(TARGET test_fuzz_request_corpus)
  target_compile_definitions(test_fuzz_request_corpus PRIVATE NB_FUZZ_REPLAY=1)
endif()
# Writes the seed corpus (run by hand: gen_request_corpus tests/fuzz/corpus).
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/gen_request_corpus.c)
  add_executable(gen_request_corpus ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/gen_request_corpus.c)
  target_link_libraries(gen_request_corpus PRIVATE nb_proto PkgConfig::JEMALLOC)
endif()

# Round trip of an empty command (ipc, tcp loopback) and of a 64-sequence
# no-compute command; the ctest is a short smoke run, figures are printed.
nb_worker_test(bench_worker_rtt bench/bench_worker_rtt.c 300 bench)
if(TARGET bench_worker_rtt)
  set_tests_properties(bench_worker_rtt PROPERTIES ENVIRONMENT
                       "NB_SHARED_DIR=${NIBBLER_SHARED_DIR};NB_BENCH_SMOKE=1")
endif()
if(TARGET bench_worker_rtt)
  target_link_libraries(bench_worker_rtt PRIVATE nb_worker_server)
endif()

# Bad command-line values: refused at start-up (exit 2) with a message that
# names the flag. The regex is what passes the test.
foreach(bad "group-size;0" "kv-memory;abc" "max-gamma;99" "target-weights;fp8" "kv-cache;int3"
            "max-seqs;-4" "seed;x1" "device;-1" "gpu-memory-utilization;1.5"
            "prefill-chunk;0" "max-batch-rows;-8")
  list(GET bad 0 flag)
  list(GET bad 1 value)
  add_test(NAME worker_bad_flag_${flag}
           COMMAND nibbler-worker --model synthetic:tiny --endpoint ipc:///tmp/nibbler-bad-flag
                   --${flag} ${value})
  set_tests_properties(worker_bad_flag_${flag} PROPERTIES LABELS worker TIMEOUT 30
                       PASS_REGULAR_EXPRESSION "bad value '${value}' for --${flag}")
endforeach()
