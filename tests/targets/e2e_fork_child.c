// End-to-end target of `ukprobe run` (tests/e2e/run.txt): forks a child that never execs
// (its agent, copied, serves no socket) and waits for it.
//   e2e_fork_child kill          the child calls e2e_fork_child_mark(i) for i = 1..3, then
//                                sends itself SIGKILL: it never calls exit_group.
//   e2e_fork_child killboth      as kill; then the parent, once it printed the child's end,
//                                calls e2e_fork_child_mark(i) for i = 11..13 and sends
//                                itself SIGKILL.
//   e2e_fork_child wait FILE     the child calls e2e_fork_child_mark(i) for i = 1..3, then
//                                reads FILE (ukprobe's trace, as ukprobe writes it) until a
//                                line of its own shows "mark: ... i=3", at most 5 s; it
//                                then calls e2e_fork_child_mark(4) and exits 0 if one
//                                came while it lived, 1 if not.
// The parent prints "child PID exit STATUS" or "child PID signal SIGNAL" and exits 0.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) int e2e_fork_child_mark(int i) {
    __asm__ volatile("" ::: "memory");
    return i * 3;
}

// Whether `path` holds a line of process `pid` with its mark 3.
static int shows_mark(const char *path, int pid) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    char task[32], line[1024];
    snprintf(task, sizeof task, "-%d ", pid);
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL)
        found = strstr(line, task) != NULL && strstr(line, " mark: ") != NULL && strstr(line, " i=3") != NULL;
    fclose(f);
    return found;
}

static int child(const char *mode, const char *file) {
    int sum = 0;
    for (int i = 1; i <= 3; ++i) sum += e2e_fork_child_mark(i);
    if (strcmp(mode, "kill") == 0 || strcmp(mode, "killboth") == 0) {
        kill(getpid(), SIGKILL);
        return 2; // not reached
    }
    for (int i = 0; i < 500; ++i) {
        if (shows_mark(file, getpid())) return sum + e2e_fork_child_mark(4) == 30 ? 0 : 2;
        const struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    return 1;
}

int main(int argc, char **argv) {
    const int known = argc >= 2 && (strcmp(argv[1], "kill") == 0 || strcmp(argv[1], "killboth") == 0 ||
                                    (strcmp(argv[1], "wait") == 0 && argc >= 3));
    if (!known) {
        fprintf(stderr, "usage: e2e_fork_child kill | killboth | wait FILE\n");
        return 2;
    }
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) exit(child(argv[1], argc > 2 ? argv[2] : ""));
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return 2;
    if (WIFSIGNALED(status))
        printf("child %d signal %d\n", (int)pid, WTERMSIG(status));
    else
        printf("child %d exit %d\n", (int)pid, WEXITSTATUS(status));
    if (strcmp(argv[1], "killboth") == 0) {
        fflush(stdout);
        for (int i = 11; i <= 13; ++i) e2e_fork_child_mark(i);
        kill(getpid(), SIGKILL);
    }
    return 0;
}
