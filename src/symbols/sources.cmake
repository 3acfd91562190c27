list(APPEND UKP_SOURCES symbols/symbols.cpp)
