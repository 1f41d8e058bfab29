/* Intel MPI's all-reduce, timed as benchmarks/peers.py times every backend (timing.h):
 * MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), as the OpenMPI column
 * calls it through mpi4py, with the barrier and the bookkeeping on a duplicate communicator, so
 * that their messages never queue among the measured ones.
 *
 * Built by peers.py with .venv-intel's `mpicc -cc=gcc` into build/peers/, and launched with that
 * venv's own mpiexec (hydra): see benchmarks/peers_native.py for the environment it runs in.
 */
#include "timing.h"

static void allreduce(float *buf, size_t count, void *ctx) {
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, *(MPI_Comm *)ctx);
}

int main(int argc, char **argv) {
    struct peers_options o;
    peers_parse(argc, argv, &o);
    MPI_Init(&argc, &argv);
    int rank, world, len;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    char library[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(library, &len);
    library[strcspn(library, "\n")] = '\0'; /* its first line names the release */

    if (o.version) {
        if (rank == 0) {
            printf("{\"version\": ");
            peers_json_string(stdout, library);
            printf("}\n");
        }
        MPI_Finalize();
        return 0;
    }

    MPI_Comm measured = MPI_COMM_WORLD, control;
    MPI_Comm_dup(MPI_COMM_WORLD, &control);
    struct peers_row rows[PEERS_MAX_SIZES];
    peers_time_sizes(&o, rank, world, control, allreduce, &measured, rows);
    int failed = rank == 0 ? peers_write_json(o.out, rows, o.nsizes, library) : 0;
    MPI_Comm_free(&control);
    MPI_Finalize();
    return failed;
}
