list(APPEND UKP_SOURCES
  control/control.cpp)
