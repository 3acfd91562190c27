// Linked with the shared agent, as programs are: prints ukp_lean_dispatch(), which
// vector_use_test checks (the tests themselves link the static library, where calls
// between the agent's files never go through a PLT).
#include <ukprobes/kprobes.h>

#include <stdio.h>

int main(void) {
    printf("%d\n", ukp_lean_dispatch());
    return 0;
}
