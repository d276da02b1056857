# mantissa_checkpoint: checkpoints (launcher/checkpoint.h) and the ecosystem formats
# (llm.c model import, safetensors export). A library of its own so that tests and fuzzers
# link it without the launcher.
add_library(mantissa_checkpoint STATIC
  ${CMAKE_CURRENT_LIST_DIR}/crc32c.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_manifest.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/llmc_import.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp)
target_link_libraries(mantissa_checkpoint PUBLIC mantissa_models mantissa_proto)
mantissa_warnings(mantissa_checkpoint)
