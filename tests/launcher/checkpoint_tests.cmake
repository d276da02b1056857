# Tests of launcher/checkpoint*, launcher/llmc_import and launcher/safetensors.
mantissa_gtest(test_checkpoint launcher ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint.cpp)
target_link_libraries(test_checkpoint PRIVATE mantissa_checkpoint)
mantissa_gtest(test_llmc_import launcher ${CMAKE_CURRENT_LIST_DIR}/test_llmc_import.cpp)
target_link_libraries(test_llmc_import PRIVATE mantissa_checkpoint)
mantissa_gtest(test_safetensors launcher ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp)
target_link_libraries(test_safetensors PRIVATE mantissa_checkpoint)
target_compile_definitions(test_safetensors PRIVATE
  CHECK_SAFETENSORS_PY="${CMAKE_CURRENT_LIST_DIR}/check_safetensors.py")
