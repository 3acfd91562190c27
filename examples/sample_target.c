/*
 * sample_target: a small program for the examples to probe. It "serves" a few requests,
 * each through handle_request(), which looks the path up and checksums it; unknown
 * paths fail with -ENOENT. requests_served counts those served (data_breakpoint.c watches it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

volatile unsigned long requests_served;

static const char *const known[] = {"/index.html", "/api/users", "/favicon.ico"};

__attribute__((noinline)) unsigned checksum(const char *data, size_t len) {
    unsigned sum = 0;
    for (size_t i = 0; i < len; i++) sum = sum * 31 + (unsigned char)data[i];
    return sum;
}

__attribute__((noinline)) int handle_request(int id, const char *path) {
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(path, known[i]) == 0) {
            unsigned sum = checksum(path, strlen(path));
            printf("sample_target: request %d %s -> %08x\n", id, path, sum);
            return (int)(sum & 0xff);
        }
    }
    printf("sample_target: request %d %s -> not found\n", id, path);
    return -ENOENT;
}

int main(int argc, char **argv) {
    static const char *const paths[] = {"/index.html", "/missing", "/api/users", "/favicon.ico"};
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    for (int i = 0; i < rounds; i++)
        if (handle_request(i, paths[i % 4]) >= 0) requests_served++;
    printf("sample_target: served %lu of %d requests\n", requests_served, rounds);
    return 0;
}
