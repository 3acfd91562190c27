// End-to-end target: forks a child every 50 ms for argv[1] seconds; each child exits at
// once through exit() (running the destructors of every loaded object, the agent's too).
// With argv[2], the forking starts once that file exists (at most 10 s later).
// Exits 0 if every child exited with 0.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const int rounds = (int)((argc > 1 ? atof(argv[1]) : 2.0) * 20);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (int i = 0; argc > 2 && access(argv[2], F_OK) != 0 && i < 1000; ++i) {
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    int bad = 0;
    for (int i = 0; i < rounds; ++i) {
        const pid_t child = fork();
        if (child == 0) exit(0);
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++bad;
        struct timespec t = {0, 50 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    printf("children %d, bad %d\n", rounds, bad);
    return bad == 0 ? 0 : 1;
}
