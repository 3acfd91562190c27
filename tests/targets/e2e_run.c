// End-to-end target of `ukprobe run` (tests/e2e/run.txt): calls its own function with
// typed arguments and libc's strtol, optionally starts itself again as a child (fork and
// exec), and exits with the status it was given.
//   e2e_run [--spawn|--reexec|--reexec-path] COUNT STATUS
// calls e2e_run_work(i, "tagI", i * 1000000007) for i = 1..COUNT, then strtol("-321"),
// prints "pid PID sum SUM agent yes|no" (whether libukprobes is mapped) and, with --spawn,
// "child PID exit STATUS" for the child it waited for; with --reexec it then execs itself
// (same process) to do it all again, and that image exits STATUS; --reexec-path does so by
// execvp() through a PATH whose first two directories do not exist (as a shell tries them).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) int e2e_run_work(int index, const char *tag, unsigned long long big) {
    __asm__ volatile("" ::: "memory");
    return index * 2 + (int)strlen(tag) + (int)(big % 7);
}

// Whether the agent is loaded in this process.
static int agent_loaded(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (maps != NULL && !found && fgets(line, sizeof line, maps) != NULL)
        found = strstr(line, "libukprobes") != NULL;
    if (maps != NULL) fclose(maps);
    return found;
}

int main(int argc, char **argv) {
    int arg = 1;
    const int spawn = argc > arg && strcmp(argv[arg], "--spawn") == 0;
    const int reexec = argc > arg && strcmp(argv[arg], "--reexec") == 0;
    const int reexec_path = argc > arg && strcmp(argv[arg], "--reexec-path") == 0;
    arg += spawn || reexec || reexec_path;
    if (argc < arg + 2) {
        fprintf(stderr, "usage: e2e_run [--spawn|--reexec|--reexec-path] COUNT STATUS\n");
        return 2;
    }
    const int count = atoi(argv[arg]);
    const int status = atoi(argv[arg + 1]);
    int sum = 0;
    for (int i = 1; i <= count; ++i) {
        char tag[16];
        snprintf(tag, sizeof tag, "tag%d", i);
        sum += e2e_run_work(i, tag, (unsigned long long)i * 1000000007ull);
    }
    // Through a volatile pointer: the compiler must call libc's strtol.
    const char *volatile text = "-321";
    sum += (int)strtol(text, NULL, 10);
    printf("pid %d sum %d agent %s\n", (int)getpid(), sum, agent_loaded() ? "yes" : "no");
    fflush(stdout);
    if (spawn) {
        const pid_t child = fork();
        if (child == 0) {
            execl("/proc/self/exe", "e2e_run", argv[arg], "0", (char *)NULL);
            _exit(127);
        }
        int st = 0;
        waitpid(child, &st, 0);
        printf("child %d exit %d\n", (int)child, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        fflush(stdout);
    }
    if (reexec) {
        execl("/proc/self/exe", "e2e_run", argv[arg], argv[arg + 1], (char *)NULL);
        return 127;
    }
    if (reexec_path) {
        char self[4096], path[4200];
        const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) return 126;
        self[n] = '\0';
        *strrchr(self, '/') = '\0';
        snprintf(path, sizeof path, "/nonexistent-ukp-a:/nonexistent-ukp-b/c:%s", self);
        setenv("PATH", path, 1);
        execlp("e2e_run", "e2e_run", argv[arg], argv[arg + 1], (char *)NULL);
        return 127;
    }
    return status;
}
