# Engine tests on the real checkpoints in ../shared (skip when absent).
nb_add_test(test_engine_stories SOURCES unit/test_engine_stories.c
            LIBS nb_worker_core nb_tokenizer PkgConfig::CJSON TIMEOUT 1800 LABELS engine)
nb_add_test(test_engine_proxy SOURCES unit/test_engine_proxy.c
            LIBS nb_worker_core PkgConfig::CJSON TIMEOUT 1200 LABELS engine)
nb_add_test(test_engine_semantics SOURCES unit/test_engine_semantics.c
            LIBS nb_worker_core PkgConfig::CJSON TIMEOUT 1200 LABELS engine)
nb_add_test(test_sample_host SOURCES unit/test_sample_host.c LIBS nb_worker_core TIMEOUT 120
            LABELS unit)
