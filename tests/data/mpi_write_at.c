/* MPI-IO N-1 writer for the live rank-attribution test (tests/live/test_mpi_ranks.py).
 *
 * usage: mpi_write_at FILE BYTES_PER_RANK REQUEST_BYTES [RESULTS]
 *
 * Every rank opens the ONE shared FILE (MPI_File_open, MPI_MODE_CREATE) and writes
 * BYTES_PER_RANK bytes at its own offset rank * BYTES_PER_RANK, REQUEST_BYTES per collective
 * MPI_File_write_at_all call. Collective buffering is switched off (romio_cb_write=disable) so
 * that each rank writes its own bytes: with it, ROMIO's aggregators would write the others'
 * data, which is what Pharos would then (rightly) attribute. Each rank prints one JSON line
 * with its rank, pid and the bytes MPI reports written (MPI_Get_count); exit code 1 on any
 * MPI error or short write.
 *
 * With RESULTS, rank 0 also writes a 4096-byte results file there after the shared file is
 * closed (one fwrite through stdio, as IOR writes its summary): the side file of issue 24,
 * which must not turn the job's N-1 pattern into N-M. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void check(int rc, const char *what, int rank) {
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        fprintf(stderr, "rank %d: %s: %s\n", rank, what, msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

int main(int argc, char **argv) {
    int rank = 0, size = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4 && argc != 5) {
        if (rank == 0) fprintf(stderr, "usage: %s FILE BYTES_PER_RANK REQUEST_BYTES [RESULTS]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long long per_rank = atoll(argv[2]), req = atoll(argv[3]);
    if (per_rank <= 0 || req <= 0 || per_rank % req != 0 || req > (1 << 30)) {
        if (rank == 0) fprintf(stderr, "BYTES_PER_RANK must be a positive multiple of REQUEST_BYTES\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_File_set_errhandler(MPI_FILE_NULL, MPI_ERRORS_RETURN);
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "romio_cb_write", "disable");
    MPI_File fh;
    check(MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_WRONLY, info, &fh), "open", rank);
    MPI_Info_free(&info);
    char *buf = malloc((size_t)req);
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(buf, 'a' + rank % 26, (size_t)req);
    long long written = 0;
    for (long long off = 0; off < per_rank; off += req) {
        MPI_Status st;
        int n = 0;
        check(MPI_File_write_at_all(fh, (MPI_Offset)rank * per_rank + off, buf, (int)req, MPI_BYTE, &st),
              "write_at_all", rank);
        MPI_Get_count(&st, MPI_BYTE, &n);
        written += n;
    }
    check(MPI_File_close(&fh), "close", rank);
    free(buf);
    long long results = 0;
    if (argc == 5 && rank == 0) {
        char text[4096];
        int n = snprintf(text, sizeof text, "ranks %d bytes_per_rank %lld request %lld written %lld\n", size,
                         per_rank, req, written);
        memset(text + n, ' ', sizeof text - (size_t)n - 1);
        text[sizeof text - 1] = '\n';
        FILE *f = fopen(argv[4], "w");
        if (!f || fwrite(text, 1, sizeof text, f) != sizeof text || fclose(f) != 0) {
            perror(argv[4]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        results = (long long)sizeof text;
    }
    printf("{\"rank\": %d, \"size\": %d, \"pid\": %d, \"bytes_written\": %lld, \"results_bytes\": %lld}\n", rank,
           size, (int)getpid(), written, results);
    fflush(stdout);
    MPI_Finalize();
    return written == per_rank ? 0 : 1;
}
