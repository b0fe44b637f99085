# Block manager tests: focused unit tests and the randomized property test
# against the tiny model in unit/bm_model.h. Host-only, no ../shared data.
nb_add_test(test_block_manager SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_block_manager.c
            LIBS nb_block_manager LABELS unit block_manager TIMEOUT 120)
nb_add_test(test_block_manager_prop SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_block_manager_prop.c
            LIBS nb_block_manager LABELS property block_manager TIMEOUT 600)
