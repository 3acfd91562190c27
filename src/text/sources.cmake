list(APPEND UKP_SOURCES text/text.cpp)
