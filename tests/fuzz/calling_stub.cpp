// The fuzzers build the tracer's files without the agent's trampolines. Those files
// call into the C library through ukp_call_saving_vectors (platform/vector_state.hpp),
// which saves the vector state around the call for a probe hit's sake. A fuzzer
// runs that code outside any probe hit, so a plain call stands in for it here.
extern "C" void ukp_call_saving_vectors(void (*fn)(void *), void *arg) { fn(arg); }
