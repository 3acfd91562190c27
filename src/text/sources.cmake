# Code memory and writes into live code.
ukp_layer(text USES platform SOURCES text.cpp)
