/*
 * sample_target: a small program for the examples to probe. It "serves" a few requests,
 * each through handle_request(), which checksums the request text.
 */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

__attribute__((noinline)) unsigned checksum(const char *data, size_t len)
{
	unsigned sum = 0;
	for (size_t i = 0; i < len; i++)
		sum = sum * 31 + (unsigned char)data[i];
	return sum;
}

__attribute__((noinline)) int handle_request(int id, const char *path)
{
	unsigned sum = checksum(path, strlen(path));
	printf("sample_target: request %d %s -> %08x\n", id, path, sum);
	return (int)(sum & 0xff);
}

int main(int argc, char **argv)
{
	static const char *paths[] = { "/index.html", "/api/users", "/favicon.ico" };
	int rounds = argc > 1 ? atoi(argv[1]) : 3;
	int total = 0;
	for (int i = 0; i < rounds; i++)
		total += handle_request(i, paths[i % 3]);
	printf("sample_target: served %d requests (total %d)\n", rounds, total);
	return 0;
}
