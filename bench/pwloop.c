/* Micro benchmark of the per-call cost: sequential 4 KiB pwrite()s (or write()s with "w")
 * over a page-cache-resident file region, repeated; prints min and median ns per call, in
 * the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID: user + system, eBPF programs run in
 * the system calls included), so that time lost to other load on a shared machine is not
 * counted. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "/var/tmp/pwloop.dat";
	int reps = argc > 2 ? atoi(argv[2]) : 15;
	int use_write = argc > 3 && argv[3][0] == 'w';
	const int n = 4096, bs = 4096; /* 16 MiB region */
	static char buf[4096];
	double t[256];
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);

	if (fd < 0 || reps > 256)
		return 1;
	memset(buf, 7, sizeof(buf));
	for (int r = 0; r <= reps; r++) {
		double t0;
		lseek(fd, 0, SEEK_SET);
		t0 = now();
		for (int i = 0; i < n; i++)
			if ((use_write ? write(fd, buf, bs) : pwrite(fd, buf, bs, (off_t)i * bs)) != bs)
				return 2;
		if (r > 0) /* first pass allocates the pages */
			t[r - 1] = (now() - t0) / n;
	}
	qsort(t, reps, sizeof(t[0]), cmp);
	printf("%.0f %.0f\n", t[0], t[reps / 2]);
	unlink(path);
	return 0;
}
