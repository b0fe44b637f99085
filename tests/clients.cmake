# Synthetic models, the client library, nibbler-generate and the Python
# client. The integration tests start the nibbler-worker binary.
nb_add_test(test_synthetic SOURCES unit/test_synthetic.c LIBS nb_worker_core TIMEOUT 120
            LABELS unit)
nb_add_test(test_client_stub SOURCES integration/test_client_stub.c LIBS nb_client PkgConfig::ZMQ
            TIMEOUT 60 LABELS unit)
if(TARGET nibbler-worker)
  nb_add_test(test_clients SOURCES integration/test_clients.c
              LIBS nb_client nb_worker_core PkgConfig::CJSON
              ARGS $<TARGET_FILE:nibbler-worker> $<TARGET_FILE:nibbler-generate>
              TIMEOUT 900 LABELS integration)
  if(TARGET test_clients)
    add_dependencies(test_clients nibbler-worker nibbler-generate)
  endif()
endif()

# The Python client: needs a python3 with zmq and google.protobuf (Debian's
# python3-zmq, python3-protobuf) and protoc for nibbler_pb2.py.
if(TARGET nibbler-worker AND TARGET nibbler_python_proto)
  find_program(NB_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT NB_PYTHON3)
    find_program(NB_PYTHON3 python3)
  endif()
  if(NB_PYTHON3)
    execute_process(COMMAND ${NB_PYTHON3} -c "import zmq, google.protobuf"
                    RESULT_VARIABLE _nb_py_ok OUTPUT_QUIET ERROR_QUIET)
    if(_nb_py_ok EQUAL 0)
      add_test(NAME test_python_client
               COMMAND ${NB_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_python_client.py
                       $<TARGET_FILE:nibbler-worker> $<TARGET_FILE:nibbler-generate>
                       ${CMAKE_BINARY_DIR}/python ${PROJECT_SOURCE_DIR}/examples/python)
      set_tests_properties(test_python_client PROPERTIES TIMEOUT 300 LABELS integration
                           ENVIRONMENT "NB_SHARED_DIR=${NIBBLER_SHARED_DIR}")
    else()
      message(STATUS "nibbler: ${NB_PYTHON3} lacks zmq/google.protobuf; test_python_client off")
    endif()
  endif()
endif()
