// Linked with the shared agent, as programs are: prints ukp_lean_dispatch() and
// ukp_trace_lean(), which
// vector_use_test checks (the tests themselves link the static library, where calls
// between the agent's files never go through a PLT).
#include <ukprobes/kprobes.h>
#include <ukprobes/trace.h>

#include <stdio.h>

int main(void) {
    printf("%d %d\n", ukp_lean_dispatch(), ukp_trace_lean());
    return 0;
}
