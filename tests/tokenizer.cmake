# Tokenizer: error statuses on generated fixtures, the GPT-2 pre-tokenizer
# and BPE tie rules on tiny synthetic vocabularies, and the two real
# tokenizers in ../shared (golden prompts/texts, round trips, encode speed).
if(NOT TARGET nb_tokenizer)
  include(${PROJECT_SOURCE_DIR}/worker/tokenizer.cmake)
endif()
nb_add_test(test_tokenizer SOURCES unit/test_tokenizer.c LIBS nb_tokenizer PkgConfig::CJSON
            TIMEOUT 120 LABELS unit)
