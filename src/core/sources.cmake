list(APPEND UKP_SOURCES
  core/hit.cpp
  core/registry.cpp
  core/signals.cpp)
