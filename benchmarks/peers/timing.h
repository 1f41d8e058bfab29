/* The timing protocol of benchmarks/peers.py (peers_ranks.py, `time_sizes`), for the drivers that
 * are not Python: impi_allreduce.c (Intel MPI) and ccl_allreduce.cpp (oneCCL). Each driver supplies
 * the measured in-place float SUM all-reduce; this file does the rest, the same way the Python
 * workers do:
 *
 *   per size: a zeroed buffer; --warmup untimed iterations; batches of the timed loop, each sized
 *   from the last one's time on the slowest rank, until one lasts --calibrate times --seconds; the
 *   count of timed iterations = max(--min-iters, ceil(--seconds x that batch's iterations / its
 *   time)), so the same on every rank; a barrier; the timed loop; time = the slowest rank's mean
 *   iteration. Then once more with every element = rank + 1, and every rank checks that each
 *   element is world(world+1)/2 (small integers, exact in float).
 *
 * The barrier and the two max-reductions go through `control`, an MPI communicator that the
 * driver duplicated for them, never through the measured collective or its communicator.
 * Rank 0 writes {"rows": [{"bytes", "time_s", "iters"}, ...], "library": ...} to --out: the JSON
 * that peers_ranks.py's workers write and peers_launch.py reads. A wrong sum aborts the job (MPI_Abort)
 * with a message naming the rank, the size and the count of wrong elements.
 *
 * Command line: DRIVER --sizes 1024,65536 --seconds 0.2 --warmup 5 --calibrate 0.1 --min-iters 3 --out PATH
 *               DRIVER --version   (rank 0 prints the library's version as one JSON line)
 */
#ifndef RINGREDUCE_PEERS_TIMING_H
#define RINGREDUCE_PEERS_TIMING_H

/* clock_gettime under -std=c11; the drivers include this file before anything else. */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PEERS_MAX_SIZES 64

struct peers_options {
    long sizes[PEERS_MAX_SIZES]; /* bytes, each a whole number of floats */
    int nsizes;
    double seconds;
    int warmup;
    double calibrate; /* the share of --seconds a calibration batch must last */
    int min_iters;
    const char *out;
    int version; /* --version: print the library's version and leave */
};

struct peers_row {
    long bytes;
    double time_s;
    long iters;
};

/* The measured collective: SUM over all ranks of `count` floats at `buf`, in place, finished on
 * return. */
typedef void (*peers_allreduce_fn)(float *buf, size_t count, void *ctx);

static void peers_usage(const char *prog, const char *why) {
    fprintf(stderr, "%s: %s\nusage: %s --sizes B1,B2,... --seconds S --warmup N --calibrate F --min-iters N --out PATH\n"
                    "       %s --version\n", prog, why, prog, prog);
    exit(2);
}

static void peers_parse(int argc, char **argv, struct peers_options *o) {
    memset(o, 0, sizeof *o);
    o->seconds = -1;
    o->warmup = -1;
    o->calibrate = -1;
    o->min_iters = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--version") == 0) {
            o->version = 1;
            continue;
        }
        if (i + 1 >= argc)
            peers_usage(argv[0], "an option without its value");
        const char *v = argv[++i];
        char *end = NULL;
        if (strcmp(a, "--sizes") == 0) {
            for (const char *p = v; *p;) {
                if (o->nsizes == PEERS_MAX_SIZES)
                    peers_usage(argv[0], "too many sizes");
                long n = strtol(p, &end, 10);
                if (end == p || n < 4 || n % 4 != 0)
                    peers_usage(argv[0], "--sizes takes byte counts, each a whole number of floats");
                o->sizes[o->nsizes++] = n;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',')
                    peers_usage(argv[0], "--sizes takes a comma list");
            }
        } else if (strcmp(a, "--seconds") == 0) {
            o->seconds = strtod(v, &end);
        } else if (strcmp(a, "--warmup") == 0) {
            o->warmup = (int)strtol(v, &end, 10);
        } else if (strcmp(a, "--calibrate") == 0) {
            o->calibrate = strtod(v, &end);
        } else if (strcmp(a, "--min-iters") == 0) {
            o->min_iters = (int)strtol(v, &end, 10);
        } else if (strcmp(a, "--out") == 0) {
            o->out = v;
        } else {
            peers_usage(argv[0], "unknown option");
        }
    }
    if (!o->version && (o->nsizes == 0 || o->seconds <= 0 || o->warmup < 1 || o->calibrate <= 0 || o->calibrate > 1 ||
                        o->min_iters < 1 || !o->out))
        peers_usage(argv[0], "--sizes, --seconds, --warmup (>= 1), --calibrate (in (0, 1]), --min-iters (>= 1) and --out "
                             "are all needed");
}

static double peers_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double peers_allmax(double x, MPI_Comm control) {
    double out = 0;
    MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, control);
    return out;
}

static void peers_run(float *buf, size_t count, long n, peers_allreduce_fn allreduce, void *ctx) {
    for (long i = 0; i < n; i++)
        allreduce(buf, count, ctx);
}

/* How many iterations last about `seconds`: peers_ranks.py's calibrate(), in C. */
static long peers_calibrate(const struct peers_options *o, float *buf, size_t count, MPI_Comm control,
                            peers_allreduce_fn allreduce, void *ctx) {
    long n = 1;
    for (;;) {
        double start = peers_now();
        peers_run(buf, count, n, allreduce, ctx);
        double took = peers_allmax(peers_now() - start, control);
        if (took < 1e-9)
            took = 1e-9;
        if (took >= o->seconds * o->calibrate) {
            long iters = (long)ceil(o->seconds * (double)n / took);
            return iters < o->min_iters ? o->min_iters : iters;
        }
        /* Toward the share with a 20% margin, at least doubling and at most 100x a batch. */
        double next = ceil((double)n * o->seconds * o->calibrate * 1.2 / took);
        if (next < 2.0 * (double)n)
            next = 2.0 * (double)n;
        if (next > 100.0 * (double)n)
            next = 100.0 * (double)n;
        n = (long)next;
    }
}

/* One row per size into `rows`; every rank runs it, every rank's rows are the same. */
static void peers_time_sizes(const struct peers_options *o, int rank, int world, MPI_Comm control,
                             peers_allreduce_fn allreduce, void *ctx, struct peers_row *rows) {
    for (int s = 0; s < o->nsizes; s++) {
        size_t count = (size_t)o->sizes[s] / sizeof(float);
        /* Owned here, freed at the end of the size. Zeroed: repeated in-place sums of anything
         * else overflow to inf within a few hundred iterations (see time_sizes). */
        float *buf = (float *)aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64);
        if (!buf) {
            fprintf(stderr, "rank %d: cannot allocate %ld bytes\n", rank, o->sizes[s]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        memset(buf, 0, count * sizeof(float));
        peers_run(buf, count, o->warmup, allreduce, ctx);
        long iters = peers_calibrate(o, buf, count, control, allreduce, ctx);
        MPI_Barrier(control);
        double start = peers_now();
        peers_run(buf, count, iters, allreduce, ctx);
        double mean = peers_allmax((peers_now() - start) / (double)iters, control);

        for (size_t i = 0; i < count; i++)
            buf[i] = (float)(rank + 1);
        allreduce(buf, count, ctx);
        float want = (float)(world * (world + 1) / 2);
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++)
            wrong += buf[i] != want;
        if (wrong) {
            fprintf(stderr, "rank %d: all-reduce of %ld bytes left %zu of %zu elements different from %g\n",
                    rank, o->sizes[s], wrong, count, (double)want);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        free(buf);
        rows[s].bytes = o->sizes[s];
        rows[s].time_s = mean;
        rows[s].iters = iters;
    }
}

/* `text` as a JSON string, quotes included; the library strings have no non-ASCII characters,
 * but newlines and quotes they may. */
static void peers_json_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Rank 0's result, as peers_ranks.py's workers write it; `library` goes along as "library". Returns 0,
 * or 1 with a message when the file cannot be written. */
static int peers_write_json(const char *path, const struct peers_row *rows, int n, const char *library) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fputs("{\"rows\": [", f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s{\"bytes\": %ld, \"time_s\": %.9e, \"iters\": %ld}", i ? ", " : "", rows[i].bytes,
                rows[i].time_s, rows[i].iters);
    fputs("], \"library\": ", f);
    peers_json_string(f, library);
    fputs("}\n", f);
    return fclose(f) != 0;
}

#endif
