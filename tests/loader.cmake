# Checkpoint loader: config.json, safetensors (single and sharded), error
# messages on generated fixtures, and the two real checkpoints in ../shared.
nb_add_test(test_loader SOURCES unit/test_loader.c LIBS nb_worker_core TIMEOUT 120 LABELS unit)
