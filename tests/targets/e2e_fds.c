// A program that minds its descriptors, as daemons and the children of subprocess
// modules do: it lists them, closes every one above 2 (close_range), dup2()s /dev/null
// over many numbers, forks, and opens files up to its limit. The events of ukprobes are
// on e2e_fds_work. With the agent, every list must be what it would be without it.
//
//   e2e_fds [--wait DIR] [--fill]
//
// Prints "fds: ..." (every descriptor above 2, with what it leads to) at the start, in a
// child of fork(), and after the close; "work N" counts the calls. --wait: prints "ready"
// and calls the work function every 10 ms until DIR/close exists, then closes, then
// again until DIR/end exists. --fill: opens /dev/null until EMFILE, prints how many
// opened against the limit, and keeps them.
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int g_calls;

__attribute__((noinline)) int e2e_fds_work(int i) {
    g_calls += 1;
    __asm__ volatile("" ::: "memory");
    return i + 1;
}

static void list(const char *who) {
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        printf("%s fds: cannot list\n", who);
        return;
    }
    char line[8192] = "";
    size_t used = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd <= 2 || fd == dirfd(d)) continue;
        char path[64], link[256] = "";
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        if (readlink(path, link, sizeof link - 1) < 0) strcpy(link, "?");
        used += (size_t)snprintf(line + used, used < sizeof line ? sizeof line - used : 0, " %d=%s", fd, link);
    }
    closedir(d);
    printf("%s fds:%s\n", who, used == 0 ? " none" : line);
    fflush(stdout);
}

static void work(int n) {
    for (int i = 0; i < n; i++) e2e_fds_work(i);
}

static void wait_for(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    while (access(path, F_OK) != 0) {
        work(1);
        usleep(10000);
    }
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    int fill = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--wait") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--fill") == 0)
            fill = 1;
    }
    work(2);
    list("start");
    const pid_t child = fork();
    if (child == 0) {
        work(3);
        list("child");
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (dir != NULL) {
        printf("ready\n");
        fflush(stdout);
        wait_for(dir, "close");
    }
    // What a daemon does: nothing above 2 stays, /dev/null over a range of numbers.
    syscall(SYS_close_range, 3u, ~0u, 0u);
    const int null = open("/dev/null", O_RDWR);
    int duped = 0;
    for (int fd = 3; fd < 1024; fd++)
        if (fd != null && dup2(null, fd) == fd) duped++;
    for (int fd = 3; fd < 1024; fd++) close(fd);
    printf("dup2 over %d numbers\n", duped);
    work(5);
    list("closed");
    if (fill) {
        struct rlimit lim;
        getrlimit(RLIMIT_NOFILE, &lim);
        int opened = 0;
        while (open("/dev/null", O_RDONLY) >= 0) opened++;
        printf("opened %d, limit %llu\n", opened, (unsigned long long)lim.rlim_cur);
        // And it exits with its table full (without --wait).
    }
    fflush(stdout);
    if (dir != NULL) wait_for(dir, "end");
    if (dir == NULL) printf("work %d\n", g_calls);
    return 0;
}
