# nibbler-worker: the serving process (server.c: ZeroMQ loop + dispatch;
# worker_main.c: flags). nb_worker_server is the library part, so tests and
# benchmarks can drive the dispatch in process (nb_server_handle()).
add_library(nb_worker_server STATIC ${CMAKE_CURRENT_SOURCE_DIR}/server.c)
target_include_directories(nb_worker_server PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(nb_worker_server PUBLIC nb_worker_core nb_proto PkgConfig::ZMQ
                      PkgConfig::JEMALLOC Threads::Threads)
target_compile_definitions(nb_worker_server PRIVATE NB_WORKER_VERSION="${PROJECT_VERSION}")
add_executable(nibbler-worker ${CMAKE_CURRENT_SOURCE_DIR}/worker_main.c)
target_link_libraries(nibbler-worker PRIVATE nb_worker_server)
