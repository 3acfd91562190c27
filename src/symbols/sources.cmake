# The loaded objects and their symbols.
ukp_layer(symbols USES platform SOURCES symbols.cpp table_cache.cpp LIBS PkgConfig::LIBELF)
