/* oneCCL's all-reduce on CPU, timed as benchmarks/peers.py times every backend (timing.h):
 * ccl::allreduce(buf, buf, n, ccl::reduction::sum, comm).wait() on float buffers, in place.
 *
 * Set-up as oneCCL's own CPU samples do it: launched by Intel MPI's mpiexec, MPI_Init, rank 0
 * creates the main key-value store (ccl::create_main_kvs(), which listens on a TCP port) and
 * broadcasts its address over MPI, the others attach to it (ccl::create_kvs), and every rank
 * creates the communicator from it. MPI also carries the barrier and the bookkeeping, on a
 * duplicate communicator; the measured calls go through oneCCL alone. What oneCCL moves the data
 * over (CCL_ATL_TRANSPORT: its MPI or its OFI transport), its algorithm (CCL_ALLREDUCE) and its
 * worker threads (CCL_WORKER_COUNT) are its defaults unless the environment sets them; peers.py
 * shows which were set.
 *
 * Built by peers.py with .venv-intel's `mpicxx -cxx=g++` into build/peers/; see
 * benchmarks/peers_native.py for the environment it runs in.
 */
#include "timing.h"

#include <oneapi/ccl.hpp>

#include <string>

static void allreduce(float *buf, size_t count, void *ctx) {
    ccl::allreduce(buf, buf, count, ccl::reduction::sum, *static_cast<ccl::communicator *>(ctx)).wait();
}

int main(int argc, char **argv) {
    peers_options o;
    peers_parse(argc, argv, &o);
    ccl::init();
    ccl::library_version v = ccl::get_library_version();
    std::string version = std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.update);
    std::string library = "oneCCL " + version + " (" + v.full + ")";
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (o.version) {
        if (rank == 0) {
            printf("{\"version\": \"%s\", \"full\": ", version.c_str());
            peers_json_string(stdout, v.full);
            printf("}\n");
        }
        MPI_Finalize();
        return 0;
    }

    MPI_Comm control;
    MPI_Comm_dup(MPI_COMM_WORLD, &control);
    int failed = 0;
    {  // oneCCL's objects go before MPI_Finalize: its MPI transport finalizes with them
        ccl::shared_ptr_class<ccl::kvs> kvs;
        ccl::kvs::address_type address;
        if (rank == 0) {
            kvs = ccl::create_main_kvs();
            address = kvs->get_address();
        }
        MPI_Bcast(address.data(), (int)address.size(), MPI_BYTE, 0, control);
        if (rank != 0)
            kvs = ccl::create_kvs(address);
        ccl::communicator comm = ccl::create_communicator(world, rank, kvs);

        peers_row rows[PEERS_MAX_SIZES];
        peers_time_sizes(&o, rank, world, control, allreduce, &comm, rows);
        failed = rank == 0 ? peers_write_json(o.out, rows, o.nsizes, library.c_str()) : 0;
        MPI_Barrier(control);  // no rank tears its communicator down while another still uses it
    }
    MPI_Comm_free(&control);
    MPI_Finalize();
    return failed;
}
