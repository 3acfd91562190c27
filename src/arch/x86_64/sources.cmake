list(APPEND UKP_SOURCES arch/x86_64/decode.cpp arch/x86_64/relocate.cpp)
