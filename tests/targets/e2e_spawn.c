// Starts programs the ways the C library does with a child that shares its memory and
// runs with every signal blocked, then with handlers reset (posix_spawn's clone(CLONE_VM |
// CLONE_VFORK)): system(), popen() and posix_spawnp() with a dup2 file action, N times
// each. Prints how many were started and how many did not exit 0.
//
//   e2e_spawn [N] [rt]
//
// With `rt`, first takes SIGRTMAX-2 with a handler of its own, as the JVM does (it
// interrupts threads blocked in I/O with it), prints "ready", and at the end sends it to
// itself once and prints how many its handler saw ("own signal: 1": none came from
// anyone else).
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

static volatile sig_atomic_t own_signals;

static void on_own_signal(int sig) {
    (void)sig;
    own_signals++;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 10;
    const int rt = argc > 2 && strcmp(argv[2], "rt") == 0;
    if (rt) {
        struct sigaction act;
        memset(&act, 0, sizeof act);
        act.sa_handler = on_own_signal;
        sigaction(SIGRTMAX - 2, &act, NULL);
        printf("ready\n");
        fflush(stdout);
    }
    int failed = 0, first = 0;
    for (int i = 0; i < n; i++) {
        int status[3] = {-1, -1, -1};
        status[0] = system("true");
        FILE *f = popen("echo x", "r");
        if (f != NULL) {
            char line[16];
            if (fgets(line, sizeof line, f) == NULL) line[0] = 0;
            status[1] = pclose(f);
        }
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, 1, 1);
        char *args[] = {"true", NULL};
        pid_t pid;
        if (posix_spawnp(&pid, "true", &actions, NULL, args, environ) == 0) waitpid(pid, &status[2], 0);
        posix_spawn_file_actions_destroy(&actions);
        for (int k = 0; k < 3; k++) {
            if (status[k] == 0) continue;
            if (failed++ == 0) first = status[k];
        }
    }
    printf("started %d, failed %d", 3 * n, failed);
    if (failed > 0) {
        if (WIFSIGNALED(first))
            printf(" (the first killed by signal %d)", WTERMSIG(first));
        else
            printf(" (the first with status 0x%x)", first);
    }
    printf("\n");
    if (rt) {
        raise(SIGRTMAX - 2);
        printf("own signal: %d\n", (int)own_signals);
    }
    return failed != 0;
}
