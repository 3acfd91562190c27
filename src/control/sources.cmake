# The control thread and its socket; protocol.hpp and fd_passing.hpp are header-only, so
# that the controller can include them.
ukp_layer(control USES platform text symbols core trace SOURCES control.cpp LIBS fmt::fmt Threads::Threads)
