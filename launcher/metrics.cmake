# mantissa_metrics: the Prometheus exporter and Pushgateway client of one rank
# (launcher/metrics.h). A library of its own so that tests link it without the launcher.
add_library(mantissa_metrics STATIC ${CMAKE_CURRENT_LIST_DIR}/metrics.cpp
                                    ${CMAKE_CURRENT_LIST_DIR}/metrics_endpoint.cpp)
target_link_libraries(mantissa_metrics PUBLIC mantissa_core PRIVATE prometheus-cpp::core
                                                                  prometheus-cpp::push)
mantissa_warnings(mantissa_metrics)
