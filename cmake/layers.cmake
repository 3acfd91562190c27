# The agent's layers as targets (docs/architecture.md, "The layers"): each folder of src/
# is an OBJECT library that sees, through its include path, only its own headers and those
# of the layers it names in USES. Its include path is a directory of the build tree with one
# link per such layer (layers/NAME/LAYER -> src/LAYER), so that `#include "trace/ring.hpp"`
# in src/core fails to compile: the build refuses a dependency the table does not list.
# libukprobes is made of every layer's objects.
set(UKP_LAYER_VIEWS ${PROJECT_BINARY_DIR}/layers CACHE INTERNAL "where the layers' include paths are made")
file(REMOVE ${UKP_LAYER_VIEWS}/table)

# ukp_layer(NAME [FOLDER dir] USES layer... SOURCES file... [LIBS target...])
function(ukp_layer name)
  cmake_parse_arguments(L "" "FOLDER" "USES;SOURCES;LIBS" ${ARGN})
  if(NOT L_FOLDER)
    set(L_FOLDER ${name})
  endif()
  set(view ${UKP_LAYER_VIEWS}/${name})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view})
  foreach(layer ${name} ${L_USES})
    get_property(folder GLOBAL PROPERTY UKP_LAYER_FOLDER_${layer})
    if(layer STREQUAL name)
      set(folder ${L_FOLDER})
    elseif(NOT folder)
      message(FATAL_ERROR "layer ${name} uses ${layer}, which is not defined before it")
    endif()
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${folder} ${view}/${folder} SYMBOLIC)
  endforeach()
  set(target ukp_${name})
  list(TRANSFORM L_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/src/${L_FOLDER}/)
  add_library(${target} OBJECT ${L_SOURCES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include ${view})
  target_link_libraries(${target} PRIVATE ${L_LIBS})
  # The table tests/layers checks the views against: NAME FOLDER USES...
  list(JOIN L_USES " " uses)
  file(APPEND ${UKP_LAYER_VIEWS}/table "${name} ${L_FOLDER} ${uses}\n")
  set_property(GLOBAL PROPERTY UKP_LAYER_FOLDER_${name} ${L_FOLDER})
  set_property(GLOBAL PROPERTY UKP_LAYER_VIEW_${name} ${view})
  set_property(GLOBAL APPEND PROPERTY UKP_LAYERS ${target})
endfunction()

# ukp_view(NAME USES layer...): the include path of a target above the layers (a tool),
# which sees the layers it names only; in ${NAME_VIEW}.
function(ukp_view name)
  cmake_parse_arguments(V "" "" "USES" ${ARGN})
  if(NOT UKP_LAYER_VIEWS)
    message(FATAL_ERROR "ukp_view(${name}): cmake/layers.cmake is not included")
  endif()
  set(view ${UKP_LAYER_VIEWS}/${name})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view})
  foreach(layer ${V_USES})
    get_property(folder GLOBAL PROPERTY UKP_LAYER_FOLDER_${layer})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${folder} ${view}/${folder} SYMBOLIC)
  endforeach()
  set(${name}_VIEW ${view} PARENT_SCOPE)
endfunction()

# The include path of layer `name` (for a target built from some of its sources again).
function(ukp_layer_view name out)
  get_property(view GLOBAL PROPERTY UKP_LAYER_VIEW_${name})
  set(${out} ${view} PARENT_SCOPE)
endfunction()
