/*
 * test_transport_fuzz.c - runs the fuzz target fuzz_transport_header (tests/fuzz/) without libFuzzer,
 * so its properties hold in every build of the test command (release, ASan+UBSan):
 *   test_transport_fuzz CORPUS_DIR          every committed seed, then 20,000 seeded random mutations
 *                                           of them (byte flips, truncation, kind and range edits)
 *   test_transport_fuzz --write CORPUS_DIR  writes the seed corpus: one valid message of each kind
 *                                           for the target's sessions, made with flx/tp_wire.h
 */
#include "../fuzz/fuzz_transport_header.c"   /* first: its fuzz_util.h defines _GNU_SOURCE */

#include <dirent.h>
#include <sys/stat.h>

#include "../kvstore/kv_testutil.h"

static void put(const char *dir, const char *name, int mode, const flx_tp_hdr_t *h, const void *payload, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f);
    uint8_t m = (uint8_t)mode, hdr[FLX_TP_HDR_BYTES];
    flx_tp_hdr_encode(h, hdr);
    CHECK(fwrite(&m, 1, 1, f) == 1 && fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr);
    if (len) CHECK(fwrite(payload, 1, len, f) == len);
    fclose(f);
}

static void write_corpus(const char *dir)
{
    mkdir(dir, 0755);
    flx_rng_t rng;
    flx_rng_seed(&rng, 1);
    const int ctl = FZ_PATCH_SESSION | FZ_HASH_HEADER, all = ctl | FZ_HASH_PAYLOAD; /* no payload hash on control */
    flx_tp_hdr_t h = {.kind = FLX_TP_HELLO, .sid = 1};
    put(dir, "hello", ctl, &h, NULL, 0);
    static uint8_t kv[2 * FZ_KV * FZ_L_STATS * FZ_D * 2];
    for (size_t i = 0; i < sizeof kv; i++) kv[i] = (uint8_t)flx_rng_u64(&rng);
    h = (flx_tp_hdr_t){.kind = FLX_TP_KV, .sid = 1, .flags = FLX_TP_FLAG_PAYLOAD_XXH3, .layer = 0, .head_begin = 0,
                       .head_end = FZ_KV, .tok_begin = 0, .tok_end = FZ_L_STATS, .arg0 = FZ_D};
    h.payload_len = flx_tp_kv_bytes(&h);
    put(dir, "kv-layer", all, &h, kv, h.payload_len);
    h.layer = 1, h.head_end = 1, h.tok_begin = 16, h.tok_end = 48; /* host-resident granules of one head */
    h.payload_len = flx_tp_kv_bytes(&h);
    put(dir, "kv-host", all, &h, kv, h.payload_len);
    h.tok_begin = 96, h.tok_end = 112; /* past the prompt: refused by the store */
    h.payload_len = flx_tp_kv_bytes(&h);
    put(dir, "kv-outside", all, &h, kv, h.payload_len);
    flx_head_stats_t st[FZ_Q];
    float mk[FZ_Q * FZ_D], qa[FZ_Q * FZ_D];
    kv_fill_stats(st, mk, qa, FZ_Q, FZ_D, &rng);
    static uint8_t sp[FZ_Q * (FLX_TP_STATS_RECORD_BYTES + 8 * FZ_D)];
    flx_tp_stats_encode(FZ_Q, FZ_D, st, mk, qa, sp);
    h = (flx_tp_hdr_t){.kind = FLX_TP_STATS, .sid = 1, .flags = FLX_TP_FLAG_PAYLOAD_XXH3, .layer = 1, .arg0 = FZ_D,
                       .arg1 = FZ_Q, .payload_len = sizeof sp};
    put(dir, "stats", all, &h, sp, sizeof sp);
    h = (flx_tp_hdr_t){.kind = FLX_TP_COMMIT, .sid = 1, .arg0 = 5, .arg1 = 0,
                       .value = 4ull * FZ_LAYERS * FZ_KV * FZ_L_PLAIN * FZ_D};
    put(dir, "commit-plain", ctl | FZ_NO_STATS_SESSION, &h, NULL, 0);
    h = (flx_tp_hdr_t){.kind = FLX_TP_HEARTBEAT};
    put(dir, "heartbeat", FZ_HASH_HEADER, &h, NULL, 0);
    flx_tp_welcome_t w = {.n_layers = 32, .n_kv_heads = 8, .n_q_heads = 32, .head_dim = 128, .prompt_len = 4000,
                          .n_sink = 64, .n_local = 256, .flags = FLX_TP_WELCOME_STATS | FLX_TP_WELCOME_CHECKSUM,
                          .heartbeat_ms = 500, .deadline_left_ns = 1000000000};
    uint8_t wb[FLX_TP_WELCOME_BYTES];
    flx_tp_welcome_encode(&w, wb);
    h = (flx_tp_hdr_t){.kind = FLX_TP_WELCOME, .sid = 1, .payload_len = sizeof wb};
    put(dir, "welcome", FZ_HASH_HEADER, &h, wb, sizeof wb);
    const char reason[] = "deadline passed";
    h = (flx_tp_hdr_t){.kind = FLX_TP_STATUS, .sid = 1, .arg0 = FLX_KV_FAILED, .payload_len = sizeof reason - 1};
    put(dir, "status", FZ_HASH_HEADER, &h, reason, sizeof reason - 1);
}

static size_t read_all(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    CHECK(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 2);
    if (!strcmp(argv[1], "--write")) {
        CHECK(argc >= 3);
        write_corpus(argv[2]);
        printf("seed corpus written to %s\n", argv[2]);
        return 0;
    }
    enum { MAX_SEEDS = 64, CAP = 1 << 16 };
    static uint8_t seeds[MAX_SEEDS][CAP];
    size_t lens[MAX_SEEDS], n_seeds = 0;
    DIR *d = opendir(argv[1]);
    CHECK(d);
    for (struct dirent *e; (e = readdir(d)) && n_seeds < MAX_SEEDS;) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        lens[n_seeds] = read_all(path, seeds[n_seeds], CAP);
        flx_error_clear();
        LLVMFuzzerTestOneInput(seeds[n_seeds], lens[n_seeds]);
        fprintf(stderr, "seed %s: %s\n", e->d_name, flx_error_msg()[0] ? flx_error_msg() : "accepted");
        n_seeds++;
    }
    closedir(d);
    /* hello, the two KV chunks inside the session, statistics, the commit, the heartbeat */
    fprintf(stderr, "seeds: %zu, accepted %lu, landed %lu\n", n_seeds, fz_accepted, fz_landed);
    CHECK(n_seeds >= 8 && fz_accepted >= 6 && fz_landed >= 3);
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_transport_fuzz"));
    static uint8_t buf[CAP];
    const int n_runs = 20000;
    for (int i = 0; i < n_runs; i++) {
        const size_t s = flx_rng_below(&rng, n_seeds);
        size_t len = lens[s];
        memcpy(buf, seeds[s], len);
        const int edits = 1 + (int)flx_rng_below(&rng, 4);
        for (int k = 0; k < edits; k++) {
            switch (flx_rng_below(&rng, 5)) {
            case 0: buf[flx_rng_below(&rng, len)] ^= (uint8_t)(1u << flx_rng_below(&rng, 8)); break;
            case 1: len = 1 + flx_rng_below(&rng, len); break;                        /* truncate */
            case 2: buf[1 + 6] = (uint8_t)flx_rng_below(&rng, 9); break;             /* kind */
            case 3: {                                                                /* a range word */
                uint32_t v = (uint32_t)flx_rng_u64(&rng) % 300;
                memcpy(buf + 1 + 40 + 4 * flx_rng_below(&rng, 7), &v, 4);
                break;
            }
            default: buf[0] = (uint8_t)flx_rng_below(&rng, 16); break;               /* mode */
            }
        }
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("test_transport_fuzz: %zu seeds and %d mutations: every property held\n", n_seeds, n_runs);
    return 0;
}
