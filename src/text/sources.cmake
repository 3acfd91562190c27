list(APPEND UKP_SOURCES text/text.cpp text/held_fd.cpp)
