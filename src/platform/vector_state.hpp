// Calls from lean code (code proven to leave the vector registers alone: arch's
// vector_use.hpp) into code that is not (the C library), with the vector state saved
// around them, so that the scan that proves the caller lean need not follow the callee.
#pragma once

#include <cstdint>
#include <type_traits>

extern "C" {
// vector_state.S: fn(arg) with the vector state saved around it.
void ukp_call_saving_vectors(void (*fn)(void *), void *arg);
// The state components XSAVE saves around C code (xsave_components() of XCR0), and the
// bytes it needs for them, or 0 where XSAVE is not enabled (FXSAVE then). Read by
// vector_state.inc's macros.
extern uint64_t ukp_xsave_size;
extern uint64_t ukp_xsave_mask;
// How vector_state.inc's macros save the vector state around C code: 0 XSAVE/FXSAVE
// everything, 1 xmm0-15 and MXCSR by hand (no AVX), 2 ymm0-15 and MXCSR by hand (XCR0 has
// nothing beyond AVX).
extern uint8_t ukp_fast_ext;
}

namespace ukp::platform {

// Of the state components the OS enabled (XCR0), those C code may change: all but PKRU
// and AMX's tiles.
uint64_t xsave_components(uint64_t xcr0);

// Calls the closure its argument points to: how a lambda goes through a call helper.
template <typename Closure>
void closure_thunk(void *c) {
    (*static_cast<Closure *>(c))();
}

// Runs f() with the vector state saved around it.
template <typename F>
void saving_vectors(F &&f) {
    ukp_call_saving_vectors(closure_thunk<std::remove_reference_t<F>>, &f);
}

} // namespace ukp::platform
