# The loaded objects and their symbols.
ukp_layer(symbols USES platform SOURCES dwarf.cpp elf_tables.cpp names.cpp object.cpp registry.cpp sdt.cpp table_cache.cpp
  LIBS PkgConfig::LIBELF PkgConfig::LIBDW)
